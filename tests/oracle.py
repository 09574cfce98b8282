"""What several test modules measure alike: `same`, two gradient lists equal bit for bit, and
`saved_storage_bytes`, what autograd saves in a forward.

Test modules import them as ``from oracle import same`` (a module of its own, not `conftest`:
with `notebooks/` collected too, the name `conftest` may be the notebooks' one)."""
import torch


def same(a, b) -> bool:
    """Two lists of tensors (or None) equal element by element, bit for bit."""
    return len(a) == len(b) and all(
        (u is None and v is None) or (u is not None and v is not None and torch.equal(u, v))
        for u, v in zip(a, b))


def saved_storage_bytes(module, *args, **kwargs):
    """(bytes, output): the distinct non-parameter storages autograd saves while
    module(*args, **kwargs) runs (the module's own parameters, frozen or quantised, left out)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = module(*args, **kwargs)
    return sum(seen.values()), y
