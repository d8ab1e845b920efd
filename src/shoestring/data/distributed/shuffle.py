"""Hash shuffles on Ray tasks, and the two things prep does with them: buckets and components.

A shuffle is ``M`` map tasks (one per input part) that each cut their rows into ``P``
partitions by a hash of a key column, and ``P`` reduce tasks that each receive partition
``p`` from every map task through Ray's object store; rows with equal keys meet in one
reduce task. Only numpy columns of ids and keys travel (16-32 bytes a row), never text.

Why Ray tasks and not Ray Data's ``groupby``/``join``: on this 2-core machine a Ray Data
hash aggregate of 100,000 rows took 10-15 s (its aggregator actors), ``join`` needs
`polars`, and ``repartition(keys=...)`` does not promise that one key's rows arrive in one
block. A plain map/reduce over the object store is the shuffle Ray documents for Ray Core,
spills to disk like any object, and its memory per reduce task is its partition: about
1/P of the shuffled rows.

``buckets``: within every bucket of rows with an equal key, the row with the smallest
``order`` is the first; every other row is a candidate duplicate of it, and with
signatures a candidate whose signature agrees with the first's (``verify_pairs``) — without,
every candidate — is a duplicate (``dropped``), linked to it by an edge. Exact dedup is
buckets over the 128-bit text key; fuzzy dedup is buckets over (band, band key), i.e. one
bucket per LSH band bucket, verified with the signatures its map tasks wrote.

``components``: connected components of those edges without ever holding all edges in
one process: the Large-Star / Small-Star alternation of Kiveris et al. ("Connected
Components in MapReduce and Beyond", SoCC 2014), each step one shuffle keyed by node, until
an iteration leaves the edge set unchanged (O(log² n) iterations in the worst case; 2 on the
dedup graphs tested, which are near-stars). At the fixpoint every component is a star around
its smallest node, so its size is its number of edges + 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shoestring.data.curate.minhash import first_in_bucket, verify_pairs
from shoestring.data.curate.text import fmix64

Columns = dict[str, np.ndarray]
_U64 = np.uint64


def partition_of(keys: np.ndarray, parts: int) -> np.ndarray:
    """Partition (0..parts-1) of each key: a mixed hash, so ids and hashes spread alike."""
    mixed = fmix64(np.asarray(keys).astype(np.uint64, copy=True))
    return (mixed % _U64(parts)).astype(np.int64)


def split_columns(cols: Columns, key: str, parts: int) -> list[Columns]:
    """The rows of ``cols`` cut into ``parts`` dicts by the hash of column ``key``."""
    where = partition_of(cols[key], parts)
    order = np.argsort(where, kind="stable")
    bounds = np.searchsorted(where[order], np.arange(parts + 1))
    return [{name: col[order[bounds[p] : bounds[p + 1]]] for name, col in cols.items()}
            for p in range(parts)]


def concat_columns(pieces: list[Columns]) -> Columns:
    pieces = [p for p in pieces if p]
    if not pieces:
        return {}
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def _map_task(fn: Callable[..., Columns], arg: Any, key: str, parts: int) -> Any:
    pieces = split_columns(fn(arg), key, parts)
    return pieces[0] if parts == 1 else tuple(pieces)


def _reduce_task(fn: Callable[[Columns], Any], *pieces: Columns) -> Any:
    return fn(concat_columns(list(pieces)))


def shuffle(map_fn: Callable[[Any], Columns], inputs: list[Any], key: str, parts: int,
            reduce_fn: Callable[[Columns], Any], reduce_returns: int = 1,
            **remote: Any) -> list[Any]:
    """``reduce_fn`` over each partition of ``map_fn``'s rows; ObjectRefs, one per partition
    (a list of ``reduce_returns`` refs each when it returns a tuple).

    ``inputs`` are plain values or ObjectRefs (Ray resolves top-level refs). ``remote``:
    Ray task options (retries).
    """
    import ray

    mapper = ray.remote(_map_task).options(num_returns=parts, **remote)
    reducer = ray.remote(_reduce_task).options(num_returns=reduce_returns, **remote)
    mapped = [mapper.remote(map_fn, x, key, parts) for x in inputs]
    if parts == 1:
        mapped = [[m] for m in mapped]
    return [reducer.remote(reduce_fn, *[m[p] for m in mapped]) for p in range(parts)]


# --- buckets ---------------------------------------------------------------------------


def bucket_firsts(cols: Columns, signatures: Callable[[np.ndarray], np.ndarray] | None = None,
                  threshold: float = 0.0) -> tuple[dict[str, Any], np.ndarray]:
    """Reduce of ``buckets``: (summary, edges). Rows: ``k0``, ``k1`` (the key), ``order``.

    The local keep rule itself (``curate.minhash.first_in_bucket``, then with
    ``signatures`` — rows by ``order`` — ``curate.minhash.verify_pairs`` at ``threshold``)
    over this partition's rows. summary: ``dropped`` (sorted unique orders with a counted
    pair to the first of some bucket), ``buckets`` (distinct keys seen), ``rows``. edges:
    ``(n, 2)`` int64 rows (duplicate, first).
    """
    if not cols or not len(cols["order"]):
        empty = {"dropped": np.zeros(0, np.int64), "buckets": 0, "rows": 0}
        return empty, np.zeros((0, 2), np.int64)
    order = cols["order"]
    first = first_in_bucket(cols["k0"], cols["k1"], order=order)
    dup = first != order  # orders are distinct within a bucket: its first row keeps its own
    later, owners = order[dup], first[dup]
    if signatures is not None:
        ok = verify_pairs(later, owners, signatures, threshold)
        later, owners = later[ok], owners[ok]
    edges = np.stack([later, owners], axis=1)
    summary = {"dropped": np.unique(later), "buckets": int(len(order) - dup.sum()),
               "rows": len(order)}
    return summary, edges


# --- connected components ----------------------------------------------------------------


def _edge_rows(edges: np.ndarray) -> Columns:
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {"node": edges[:, 0], "nbr": edges[:, 1]}


def _both_ways(edges: np.ndarray) -> Columns:
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {"node": np.concatenate([e[:, 0], e[:, 1]]), "nbr": np.concatenate([e[:, 1], e[:, 0]])}


def _larger_first(edges: np.ndarray) -> Columns:
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {"node": e.max(axis=1), "nbr": e.min(axis=1)}


def _grouped(cols: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique (node, nbr) pairs sorted by node; each row's group start; group minimum nbr."""
    if not cols or not len(cols["node"]):
        z = np.zeros(0, np.int64)
        return z, z, z, z
    pairs = np.unique(np.stack([cols["node"], cols["nbr"]], axis=1), axis=0)
    node, nbr = pairs[:, 0], pairs[:, 1]
    new = np.ones(len(node), dtype=bool)
    new[1:] = node[1:] != node[:-1]
    group = np.cumsum(new) - 1
    # sorted by (node, nbr): a group's first row holds its smallest neighbour
    low = np.minimum(nbr[new], node[new])[group]
    return node, nbr, group, low


def _edge_signature(node: np.ndarray, nbr: np.ndarray) -> tuple[int, int]:
    """(count, sum of hashes) of the undirected edges {node, nbr} with node < nbr."""
    keep = node < nbr
    h = fmix64((node[keep].astype(np.uint64) << _U64(32)) ^ nbr[keep].astype(np.uint64))
    return int(keep.sum()), int(h.sum(dtype=np.uint64))


def large_star(cols: Columns) -> tuple[tuple[int, int], np.ndarray]:
    """Each node links its larger neighbours to the smallest of its neighbourhood."""
    node, nbr, _, low = _grouped(cols)
    sig = _edge_signature(node, nbr)
    out = nbr > node
    return sig, np.stack([nbr[out], low[out]], axis=1)


def small_star(cols: Columns) -> np.ndarray:
    """Each node links itself and its (smaller) neighbours to the smallest of them."""
    node, nbr, group, low = _grouped(cols)
    new = np.ones(len(node), dtype=bool)
    new[1:] = group[1:] != group[:-1]
    members = np.concatenate([nbr, node[new]])
    target = np.concatenate([low, low[new]])
    out = members != target
    return np.stack([members[out], target[out]], axis=1)


def _component_sizes(cols: Columns) -> dict[int, int]:
    """Reduce keyed by root: size histogram (size → count) of the stars rooted here."""
    if not cols or not len(cols["node"]):
        return {}
    pairs = np.unique(np.stack([cols["node"], cols["nbr"]], axis=1), axis=0)
    _, counts = np.unique(pairs[:, 1], return_counts=True)
    sizes, freq = np.unique(counts + 1, return_counts=True)
    return {int(s): int(f) for s, f in zip(sizes, freq)}


def _roots_by_root(edges: np.ndarray) -> Columns:
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    return {"node": e[:, 0], "nbr": e[:, 1], "root": e[:, 1]}


def components(edge_refs: list[Any], parts: int, **remote: Any) -> dict[str, Any]:
    """Connected components of the edges in ``edge_refs`` (ObjectRefs of ``(n, 2)`` arrays).

    Returns ``clusters`` (components), ``cluster_sizes`` (size → count) and ``iterations``.
    """
    import ray

    refs, previous, iterations = edge_refs, None, 0
    while True:
        iterations += 1
        out = shuffle(_both_ways, refs, "node", parts, large_star, reduce_returns=2, **remote)
        sigs = ray.get([o[0] for o in out])
        sig = (sum(s[0] for s in sigs), sum(s[1] for s in sigs) % (1 << 64))
        if sig == previous:
            break
        previous = sig
        starred = [o[1] for o in out]
        refs = shuffle(_larger_first, starred, "node", parts, small_star, **remote)
    hist: dict[int, int] = {}
    for part in ray.get(shuffle(_roots_by_root, refs, "root", parts, _component_sizes, **remote)):
        for size, count in part.items():
            hist[size] = hist.get(size, 0) + count
    return {"clusters": sum(hist.values()), "cluster_sizes": dict(sorted(hist.items())),
            "iterations": iterations}
