"""The course's scaffolding: what the notebooks lay out, on top of the library.

`course` (links, device, sizes, claims checked against measurements), `widgets` (sliders whose
logic tests drive headlessly), `plots` (the course's figures, one palette), `exercises` (one
module per lesson: questions and the checkers that measure the answer), and the demos some
lessons run (`hf`, `stack`, `compiled`, `scale_out`, `large_vocab`). Everything here imports
the library (``ckpt_lab``); nothing in the library imports this package. Your own training
code needs none of it.
"""
