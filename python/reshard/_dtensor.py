# SPDX-License-Identifier: Apache-2.0
"""DTensor placements as layout spec items, and a DTensor's mesh, placements and shard order
as one layout.

torch applies a DTensor's placements left to right over the mesh dims, unless its spec has a
shard order (DTensorSpec.shard_order, newer torch) that shards a tensor dim over its mesh dims
in another order. The planner applies mesh dims left to right, so a shard order becomes a
permutation of the mesh: the same ranks, the mesh dims reordered so that each tensor dim's
mesh dims come in its shard order. The ranks' shards are then exactly what torch's nested
torch.chunk in that order gives, uneven sizes included.
"""


def placement(p, ndim, fail):
    """The spec item of one placement: a spec string, Replicate, Shard or _StridedShard."""
    if isinstance(p, str):
        return p
    kind = type(p).__name__
    dim = getattr(p, "dim", None)
    if isinstance(dim, int) and dim < 0:
        dim += ndim
    if kind == "Replicate":
        return "R"
    if kind == "_StridedShard":  # before Shard: torch derives it from Shard
        return "SS(%d,%d)" % (dim, int(p.split_factor))
    if kind == "Shard":
        return "S(%d)" % dim
    if kind in ("Partial", "_Partial", "_NormPartial", "MaskPartial"):
        fail("ERR_INVALID_ARG",
             "a Partial placement holds partial sums, not a shard: redistribute the DTensor to "
             "Shard or Replicate before a refit")
    fail("ERR_INVALID_ARG", "placement %r is not Replicate, Shard or _StridedShard" % (p,))


def _default_order(placements, ndim):
    order = {}
    for i, p in enumerate(placements):
        dim = getattr(p, "dim", None)
        if type(p).__name__ in ("Shard", "_StridedShard") and isinstance(dim, int):
            order.setdefault(dim % ndim, []).append(i)
    return {d: tuple(v) for d, v in order.items()}


def mesh_permutation(placements, shard_order, ndim, fail):
    """The order of mesh dims that applies `shard_order` left to right, or None when it is
    the default order. shard_order: (tensor_dim, mesh_dims) entries (ShardOrderEntry)."""
    if shard_order is None:
        return None
    given = {}
    for entry in shard_order:
        dim = int(getattr(entry, "tensor_dim", entry[0] if isinstance(entry, tuple) else -1))
        dims = tuple(int(m) for m in getattr(entry, "mesh_dims", entry[1] if
                                             isinstance(entry, tuple) else ()))
        given[dim % ndim] = dims
    if given == _default_order(placements, ndim):
        return None
    if any(type(p).__name__ == "_StridedShard" for p in placements):
        fail("ERR_INVALID_ARG",
             "the DTensor has both _StridedShard placements and a shard order %s: redistribute "
             "it to plain Shard placements first" % (shard_order,))
    for dim, dims in given.items():
        for m in dims:
            p = placements[m] if 0 <= m < len(placements) else None
            if type(p).__name__ != "Shard" or getattr(p, "dim", None) % ndim != dim:
                fail("ERR_INVALID_ARG", "the shard order %s names mesh dim %d for tensor dim %d, "
                     "but its placement is %r" % (shard_order, m, dim, p))
    perm = list(range(len(placements)))
    for dims in given.values():
        for slot, m in zip(sorted(dims), dims):
            perm[slot] = m
    return perm


def describe(t, fail):
    """(shape, dtype, global ranks in mesh order, mesh shape, placements) of a DTensor, its
    shard order applied."""
    mesh = getattr(getattr(t, "device_mesh", None), "mesh", None)
    placements = getattr(t, "placements", None)
    if mesh is None or placements is None:
        fail("ERR_INVALID_ARG", "from_dtensor takes a DTensor (torch.distributed.tensor), got %s: "
             "use Layout.from_placements for a plain tensor" % type(t).__name__)
    shape = tuple(int(n) for n in t.shape)
    placements = tuple(placements)
    spec = getattr(t, "_spec", None)
    order = getattr(spec, "shard_order", None)
    if getattr(spec, "use_strided_shard_as_shard_order", False):
        order = None  # the _StridedShard placements encode the order themselves
    perm = mesh_permutation(placements, order, len(shape), fail)
    if perm is not None:
        mesh = mesh.permute(*perm) if hasattr(mesh, "permute") else mesh.transpose(perm)
        placements = tuple(placements[i] for i in perm)
    return shape, t.dtype, mesh.flatten().tolist(), tuple(mesh.shape), placements
