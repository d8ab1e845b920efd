"""Hash shuffles on Ray tasks, and what prep does with them: buckets.

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

The clusters those edges form are counted on the driver with the local run's own
``curate.minhash.Clusters``, one partition's edges at a time (``cluster_sizes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shoestring.prep.curate.minhash import Clusters, first_in_bucket, verify_pairs
from shoestring.prep.curate.text import fmix64

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
    pair to the first of some bucket), ``owners`` (the sorted unique firsts they pair
    with), ``buckets`` (distinct keys seen), ``rows``. edges:
    ``(n, 2)`` int64 rows (duplicate, first).
    """
    if not cols or not len(cols["order"]):
        empty = {"dropped": np.zeros(0, np.int64), "owners": np.zeros(0, np.int64),
                 "buckets": 0, "rows": 0}
        return empty, np.zeros((0, 2), np.int64)
    order = cols["order"]
    first = first_in_bucket(cols["k0"], cols["k1"], order=order)
    dup = first != order  # orders are distinct within a bucket: its first row keeps its own
    later, owners = order[dup], first[dup]
    if signatures is not None:
        ok = verify_pairs(later, owners, signatures, threshold)
        later, owners = later[ok], owners[ok]
    edges = np.stack([later, owners], axis=1)
    summary = {"dropped": np.unique(later), "owners": np.unique(owners),
               "buckets": int(len(order) - dup.sum()), "rows": len(order)}
    return summary, edges


# --- clusters ---------------------------------------------------------------------------


def cluster_sizes(summaries: list[dict[str, Any]], edge_refs: list[Any]) -> dict[int, int]:
    """Size histogram of the connected components of the edges in ``edge_refs`` (ObjectRefs
    of the reduce tasks' ``(n, 2)`` arrays), counted by ``curate.minhash.Clusters`` — the
    local run's union-find — fetching one partition's edges at a time. ``summaries``: those
    reduce tasks' summaries (their ``dropped`` and ``owners`` name every node)."""
    import ray

    nodes = np.unique(np.concatenate([np.zeros(0, np.int64)] + [
        np.concatenate([s["dropped"], s["owners"]]) for s in summaries]))
    clusters = Clusters(nodes)
    for ref in edge_refs:
        edges = ray.get(ref)
        clusters.link(edges[:, 0], edges[:, 1])
    return clusters.sizes()
