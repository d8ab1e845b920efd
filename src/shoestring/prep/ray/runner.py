"""``shoestring prep --executor ray``: the local pipeline's stages on a Ray cluster.

`RayExecutor` runs prep's `driver.Driver` (journal, split rule, tokenizer settings,
manifest) with `RayStages`, which do the work as Ray tasks:

=============  ==========================================================================
stage          on Ray
=============  ==========================================================================
read           Ray Data map, one task per source: read, clean, the stateless blocks
               before the first stateful one (filters); parts of ``part_docs`` documents
stateful       each stateful block by its registered shuffle (``SHUFFLES``): exact dedup
blocks         = buckets of the 128-bit text key; fuzzy dedup = MinHash signatures in map
               tasks, buckets of (band, band key) whose pairs are verified on the
               signatures (``shuffle``); clusters counted on the driver by the local
               run's union-find (``curate.minhash.Clusters``)
final          Ray Data map per part: drop what the dedup stages dropped, run the
               stateless blocks after them (decontamination, its n-gram index broadcast
               once), mark validation documents by content hash
tokenizer      one task streams the training sample from the parts and trains
encode         Ray Data map per part and split: tokenize (+ compressibility), own files
pack           Ray Data map per shard: cut its sequences from the parts' token streams and
               write the shard; one manifest lists every shard with its sha256 (with
               ``data.order=sort``: unigram counts and scores per range first, one argsort)
=============  ==========================================================================

Same inputs → same kept documents, dedup clusters and byte-identical shards as the local
executor (tests/test_prep_ray.py): rows carry their input position (rid), so "first in
input order" is decidable in any task, and packing cuts the same global stream.

A stateless block added to ``Curator.from_config`` runs here as it is (it joins a map
stage); a stateful one needs an entry in ``SHUFFLES`` — until it has one, ``plan_ray``
refuses it by name (exit 2), as it refuses settings it does not implement.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from shoestring.config import CurateConfig, DataConfig
from shoestring.data.sources import Document, ReadStats
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_bytes_atomic
from shoestring.prep.curate.blocks import Block, BlockStats
from shoestring.prep.curate.normalize import Clean
from shoestring.prep.driver import MIN_VAL_DOCUMENTS, Driver, ReadOutput, Split
from shoestring.prep.executor import WORK_DIR, Journal, PrepPlan, fault_point
from shoestring.prep.ray import remote
from shoestring.prep.ray.session import WHERE, ray_session
from shoestring.prep.ray.shuffle import bucket_firsts, cluster_sizes, shuffle
from shoestring.prep.stages import NO_COUNTS, pack_record, shard_ranges, sorts, train_on_sample
from shoestring.progress import progress_bar


@dataclass
class RayOptions:
    """How prep uses Ray (none of it changes the output)."""

    address: str | None = None  # None: the Ray of this process, or a new local one; "auto":
    # the cluster `ray start` left on this machine; HOST:PORT: that cluster
    part_docs: int = 8192  # documents per part: the unit of every per-part task
    part_chars: int = 64 << 20  # ... or characters, whichever comes first
    partitions: int | None = None  # shuffle partitions; default: the cluster's CPUs
    fault: str | None = field(default=None, repr=False)  # tests: see remote.maybe_fail


@dataclass
class RayPlan:
    """The blocks in order (clean, then curation), cut into Ray stages (``plan_ray``)."""

    stages: list[tuple[str, list[Block]]]  # ("map", stateless blocks) / ("shuffle", [block])


def plan_ray(cfg: DataConfig, curate: CurateConfig | None) -> RayPlan:
    """The stages for these settings, or a ``ShoestringError`` naming what Ray cannot run."""
    refuse: list[tuple[str, str]] = []
    if cfg.workers != 1:
        refuse.append(("--workers / data.workers", "Ray schedules its own tasks: leave it at 1"))
    if curate is not None and curate.explain:
        refuse.append(("--explain / curate.explain", "run --explain with --executor local"))
    if curate is not None and curate.dropped_ids:
        refuse.append(("curate.dropped_ids", "list dropped documents with --executor local"))
    if curate is not None and curate.canaries:
        refuse.append(("--canaries / curate.canaries", "plant canaries with --executor local "
                       "(docs/privacy.md)"))
    if curate is not None and curate.dedup_against:
        refuse.append(("--dedup-against / curate.dedup_against",
                       "dedup against an earlier data dir with --executor local"))
    blocks: list[Block] = [Clean(cfg.min_chars)]
    if curate is not None:
        from shoestring.prep.curate import Curator

        blocks += Curator.from_config(curate.model_copy(update={"dedup_against": []})).blocks
    for block in blocks:
        if block.stateful and block.name not in SHUFFLES:
            refuse.append((f"the {block.name} block",
                           "it needs the whole corpus in one process; run it with "
                           "--executor local"))
    if refuse:
        what = "; ".join(name for name, _ in refuse)
        raise ShoestringError(f"not supported by the ray executor: {what}", where=WHERE,
                              fix="; ".join(f"{name}: {fix}" for name, fix in refuse))
    plan: list[tuple[str, list[Block]]] = []
    for block in blocks:
        if block.stateful:
            plan.append(("shuffle", [block]))
        elif plan and plan[-1][0] == "map":
            plan[-1][1].append(block)
        else:
            plan.append(("map", [block]))
    return RayPlan(plan)


class RayExecutor:
    """``--executor ray``: the `Executor` (``prep/executor.py``) that runs prep on Ray."""

    name = "ray"

    def __init__(self, options: RayOptions | None = None) -> None:
        self.options = options or RayOptions()
        self.plan: RayPlan | None = None

    def check(self, cfg: DataConfig, curate: CurateConfig | None) -> None:
        """Refuse a mixture and what `plan_ray` refuses; keep the plan for `run`."""
        if cfg.mixture is not None:
            raise ShoestringError("data.mixture is prepared by the local executor only",
                                  where="--executor", fix="drop --executor ray, or the mixture")
        self.plan = plan_ray(cfg, curate)

    def session(self) -> ray_session:
        return ray_session(self.options.address)

    def build_fingerprint(self, data: str) -> str:
        """Apart from the data's: the build folder holds Ray's own parts (``work/``)."""
        return hashlib.sha256(f"{data}:{self.name}".encode()).hexdigest()

    def run(self, plan: PrepPlan, journal: Journal) -> dict:
        """Run prep on Ray (connecting to ``options.address`` or starting a local instance)."""
        ray_plan = self.plan or plan_ray(plan.cfg, plan.curate)
        with ray_session(self.options.address):
            return Driver(plan, journal, RayStages(plan, journal, ray_plan, self.options)).run()


def _user_error(exc: BaseException) -> ShoestringError | None:
    """The bad-input error a Ray task raised (``ray.get`` of a plain Ray task), if any."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ShoestringError) else None


class RayStages:
    """The `driver.Stages` on Ray: read/curate, tokenizer training, encode and pack."""

    def __init__(self, prep: PrepPlan, journal: Journal, plan: RayPlan, opts: RayOptions) -> None:
        import ray

        self.plan, self.opts, self.journal = plan, opts, journal
        self.files, self.build, self.cfg = prep.files, prep.build, prep.cfg
        self.curate_cfg, self.console = prep.curate, prep.console
        self.kept_shards = 0
        self.seconds: dict[str, float] = {}  # each Ray Data map's, by its label
        self.work = self.build / WORK_DIR
        # Plain Ray tasks (shuffles, tokenizer training): a dead worker or an I/O error.
        self.retry = {"max_retries": 3, "retry_exceptions": [OSError]}
        self.partitions = opts.partitions or max(2, int(ray.cluster_resources().get("CPU", 2)))
        self.state: dict[str, Any] = self.journal.get("ray") or {}

    # --- plumbing -----------------------------------------------------------------------

    def _save(self, stage: str, value: Any) -> None:
        self.state[stage] = value
        self.journal.put("ray", self.state)
        fault_point(f"ray.{stage}", 1)

    def _map(self, label: str, items: list[dict], fn: Callable[..., dict],
             **kwargs: Any) -> list[dict]:
        """``fn(item, **kwargs)`` for every item, one Ray Data task each; their summaries."""
        import ray.data

        if not items:
            return []
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        # Ray Data retries a task whose worker died without limit (its default); a bad
        # input comes back as the task's summary, not as a failure to retry.
        ds = ds.map(fn, fn_kwargs={**kwargs, "fault": self.opts.fault}, num_cpus=1)
        out: list[dict] = []
        t = time.perf_counter()
        with progress_bar(self.console) as bar:
            task = bar.add_task(label, total=len(items), unit="tasks")
            for row in ds.iter_rows():
                out.append(json.loads(row["summary"]))
                remote.raise_user_error(out[-1])
                bar.update(task, advance=1)
        self.seconds[label] = round(time.perf_counter() - t, 3)
        return out

    def _core(self, refs: list[Any]) -> list[Any]:
        import ray

        try:
            return ray.get(refs)
        except Exception as e:
            user = _user_error(e)
            if user is not None:
                raise user from None
            raise

    def _line(self, stage: str, docs_in: int, docs_out: int, note: str = "") -> None:
        self.console.print(f"[ray] {stage}: {docs_in:,} → {docs_out:,} documents"
                           + (f" ({note})" if note else ""), markup=False, highlight=False)

    def _dropped(self, plan: list[tuple[str, list[Block]]], k: int) -> np.ndarray:
        """Sorted positions the shuffle stages before stage ``k`` dropped, back to the last
        map stage (which wrote new parts without them)."""
        found = [np.zeros(0, np.int64)]
        for j in range(k - 1, -1, -1):
            if plan[j][0] != "shuffle":
                break
            found.append(np.load(self.work / f"dropped-stage{j}.npy"))
        return np.unique(np.concatenate(found))

    def _put_dropped(self, key: str, dropped: np.ndarray) -> None:
        import io

        buf = io.BytesIO()
        np.save(buf, np.unique(dropped).astype(np.int64))
        write_bytes_atomic(self.work / f"dropped-{key}.npy", buf.getvalue())

    # --- read + curate ------------------------------------------------------------------

    def read(self) -> ReadOutput:
        import ray

        self.work.mkdir(exist_ok=True)
        stages_ = list(self.plan.stages)
        first = stages_.pop(0)[1] if stages_ and stages_[0][0] == "map" else []
        last = stages_.pop()[1] if stages_ and stages_[-1][0] == "map" else []
        work = str(self.work)
        if "read" not in self.state:
            if len(self.files) > remote.MAX_SOURCES:
                raise ShoestringError(f"{len(self.files):,} sources: the ray executor numbers "
                                      f"at most {remote.MAX_SOURCES:,}", where=WHERE,
                                      fix="concatenate small files into bigger ones")
            items = [{"index": i, "source": s} for i, s in enumerate(self.files)]
            done = self._map("read + clean + filters", items, remote.read_source, cfg=self.cfg,
                             blocks=ray.put(first), work=work, part_docs=self.opts.part_docs,
                             part_chars=self.opts.part_chars)
            done.sort(key=lambda s: s["index"])
            self._save("read", {
                "parts": [p for s in done for p in s["parts"]],
                "read": sum(s["read"] for s in done),
                "files": sum(s["files"] for s in done),
                "skipped": [x for s in done for x in s["skipped"]],
                "counts": {k: sum(s["counts"][k] for s in done) for k in done[0]["counts"]}
                if done else {},
                "reports": remote.merge_reports([b.report() for b in first],
                                                [s["reports"] for s in done]),
            })
        read = self.state["read"]
        reports: list[dict] = list(read["reports"])
        for report in reports:
            self._line(report["block"], report["documents_in"], report["documents_out"])
        rows = sum(p["rows"] for p in read["parts"])
        src = "parts0"
        for k, (kind, blocks) in enumerate(stages_):
            key = f"stage{k}"
            if key not in self.state:
                dropped_ref = ray.put(self._dropped(stages_, k))
                if kind == "shuffle":
                    report, dropped, info = SHUFFLES[blocks[0].name](
                        self, blocks[0], src, read["parts"], dropped_ref, rows)
                    self._put_dropped(key, dropped)
                    self._save(key, {"reports": [report], "rows": report["documents_out"],
                                     "src": src, **info})
                else:
                    dst = f"parts{k + 1}"
                    self._save(key, self._apply(blocks, src, dst, read["parts"], dropped_ref,
                                                None, f"blocks {k}") | {"src": dst})
            st = self.state[key]
            reports += st["reports"]
            self._line(", ".join(b.name for b in blocks), rows, st["rows"])
            rows, src = st["rows"], st["src"]
        if "final" not in self.state:
            dropped_ref = ray.put(self._dropped(stages_, len(stages_)))
            final = self._apply(last, src, "kept", read["parts"], dropped_ref,
                                self.cfg.val_fraction, "curate + split")
            self._save("final", final)
        final = self.state["final"]
        reports += final["reports"]
        for report in final["reports"]:
            self._line(report["block"], report["documents_in"], report["documents_out"])
        return self._finish_read(read, final, reports)

    def _apply(self, blocks: list[Block], src: str, dst: str, parts: list[dict],
               dropped_ref: Any, val_fraction: float | None, label: str) -> dict:
        import ray

        items = [{"name": p["name"]} for p in parts]
        done = self._map(label, items, remote.apply_part, blocks=ray.put(blocks),
                         dropped=dropped_ref, work=str(self.work), src=src, dst=dst,
                         val_fraction=val_fraction)
        return {"rows": sum(s["rows"] for s in done), "val": sum(s["val"] for s in done),
                "chars": sum(s["chars"] for s in done),
                "train_chars": sum(s["chars"] - s["val_chars"] for s in done),
                "reports": remote.merge_reports([b.report() for b in blocks],
                                                [s["reports"] for s in done])}

    def _finish_read(self, read: dict, final: dict, reports: list[dict]) -> ReadOutput:
        stats = ReadStats(files=read["files"], documents=read["read"], skipped=read["skipped"])
        stats.add(read.get("counts", {}))
        split = Split(self.build, self.cfg.val_fraction)
        if 0 < final["rows"] and final["val"] < MIN_VAL_DOCUMENTS:
            self._split_by_position(read["parts"], split)
        else:  # by document: the final map marked each row's split
            split.kept, split.chars, split.train_chars = (final[k] for k in
                                                          ("rows", "chars", "train_chars"))
            split.n = {"train": final["rows"] - final["val"], "val": final["val"]}
        return ReadOutput(stats, reports, split)

    def _split_by_position(self, parts: list[dict], split: Split) -> None:
        """Too few validation documents: the local rule (the end of the text), on the driver;
        the kept parts become one part with the cut documents."""
        names = [p["name"] for p in parts]
        final = self.state["final"]
        if "split" in final:  # done before an interruption: the one part holds the flags
            val = remote.read_part(self.work / "kept" / f"{names[0]}.parquet", ["val"])["val"]
            split.n = {"train": len(val) - int(val.sum()), "val": int(val.sum())}
            split.kept, split.chars, split.how = final["rows"], final["chars"], final["split"]
            split.train_chars = final["train_chars"]
            return
        split.write(Document(text, "", "") for name in names
                    for text in remote.read_part(self.work / "kept" / f"{name}.parquet")["text"])
        split.close()  # writes spool-train / spool-val, removes the spool of all
        texts, val = [], []
        for name, flag in (("train", False), ("val", True)):
            path = self.build / f"spool-{name}.jsonl"
            with open(path, encoding="utf-8") as f:
                for line in f:
                    texts.append(json.loads(line))
                    val.append(flag)
            path.unlink()
        shutil.rmtree(self.work / "kept")
        remote.write_part(self.work / "kept" / f"{names[0]}.parquet", np.arange(len(texts)),
                          texts, np.array(val, dtype=bool))
        final.update(names=[names[0]], split=split.how, train_chars=split.train_chars)
        self.journal.put("ray", self.state)

    def _kept_names(self) -> list[str]:
        final = self.state["final"]
        return final.get("names") or [p["name"] for p in self.state["read"]["parts"]]

    # --- tokenizer, encode, pack --------------------------------------------------------

    def train_texts(self) -> Iterator[str]:
        """The training documents, part by part (read on the driver)."""
        return remote.train_texts([self.work / "kept" / f"{n}.parquet" for n in self._kept_names()])

    def train_tokenizer(self, kind: str, n_train: int) -> tuple[Any, dict[str, int]]:
        import ray

        paths = [self.work / "kept" / f"{n}.parquet" for n in self._kept_names()]
        train = ray.remote(train_on_sample).options(num_cpus=1, **self.retry)
        tok, sample = self._core(train.remote(
            partial(remote.train_texts, paths), self.cfg.tokenizer_sample_chars,
            self.state["final"]["train_chars"], kind, self.cfg.family, self.cfg.vocab_size,
            self.cfg.lowercase_resolved))
        self.state["tokenizer_sample"] = sample
        self.journal.put("ray", self.state)
        return tok, sample

    def encode(self, split: str, tok: Any, sep: int, dtype: np.dtype, n_docs: int,
               compress: Any) -> dict:
        items = [{"name": n, "split": split} for n in self._kept_names()]
        done = self._map(f"tokenize {split}", items, remote.encode_part, work=str(self.work),
                         tokenizer=str(self.build / "tokenizer.json"), sep_id=sep,
                         dtype=dtype.str, compress=compress)
        done.sort(key=lambda s: s["name"])
        offsets = np.cumsum([0] + [s["tokens"] for s in done]).tolist()
        parts = [{"name": s["name"], "tokens": s["tokens"], "offset": offset}
                 for s, offset in zip(done, offsets)]
        state = {**{key: sum(s[key] for s in done) for key in NO_COUNTS}, "done": True,
                 "parts": parts}
        self.journal.put(f"encode.{split}", state)
        fault_point(f"ray.encode.{split}", 1)
        return state

    def pack(self, split: str, enc: dict, dtype: np.dtype, ids: dict[str, int],
             vocab: int) -> dict:
        cfg = self.cfg
        body = cfg.row_body
        n = enc["tokens"] // body
        items = [{"index": k, "lo": lo, "hi": hi}
                 for k, (lo, hi) in enumerate(shard_ranges(n, cfg))]
        order = self._sort_order(items, enc["parts"], split, dtype, body, vocab) \
            if sorts(cfg, split) and n else None
        done = self._map(f"pack {split}", items, remote.pack_part, work=str(self.work),
                         build=str(self.build), parts=enc["parts"], split=split, cfg=cfg,
                         ids=ids, dtype=dtype.str, order=order)
        done.sort(key=lambda s: s["bin"])
        self.kept_shards += sum(s.pop("kept") for s in done)
        self.journal.put(f"pack.{split}", {"shards": done})
        return pack_record(cfg, split, enc, done)

    def _sort_order(self, ranges: list[dict], parts: list[dict], split: str, dtype: np.dtype,
                    body: int, vocab: int) -> str:
        """Cramming's order over the whole split (``packing.unigram_sort_order``): token
        counts per range of sequences (tasks), summed; scores per range (tasks), with the
        log-probabilities broadcast; one stable argsort on the driver (8 bytes a sequence,
        as the local packer holds). Returns the path of the saved order."""
        import io

        import ray

        from shoestring.prep.packing import unigram_logp

        path = self.work / "sort" / "order.npy"
        if path.is_file():
            return str(path)
        common = {"work": str(self.work), "parts": parts, "split": split, "dtype": dtype.str,
                  "body": body, "vocab": vocab}
        done = self._map("unigram counts", ranges, remote.unigram_part, **common)
        counts = sum(np.load(s["path"]) for s in done)
        done = self._map("unigram scores", ranges, remote.unigram_part, **common,
                         logp=ray.put(unigram_logp(counts)))
        done.sort(key=lambda s: s["index"])
        scores = np.concatenate([np.load(s["path"]) for s in done])
        buf = io.BytesIO()
        np.save(buf, np.argsort(scores, kind="stable").astype(np.int64))
        write_bytes_atomic(path, buf.getvalue())
        return str(path)

    def describe(self) -> dict:
        """The manifest's ``executor``: Ray's version and how the work was cut."""
        import ray

        return {
            "name": "ray",
            "ray_version": ray.__version__,
            "parts": len(self._kept_names()),
            "shuffle_partitions": self.partitions,
            "tokenizer_sample": self.state.get("tokenizer_sample"),
        }

    # --- the stateful blocks' shuffles ---------------------------------------------------

    def _inputs(self, src: str, parts: list[dict], dropped_ref: Any, *extra: Any) -> list:
        return [(str(self.work / src / f"{p['name']}.parquet"), dropped_ref, str(self.work),
                 self.opts.fault, *extra) for p in parts]

    def exact_dedup(self, block: Block, src: str, parts: list[dict], dropped_ref: Any,
                    rows: int) -> tuple[dict, np.ndarray, dict]:
        """Exact dedup: buckets of the 128-bit text key; the first row of each is kept."""
        out = shuffle(remote.exact_rows, self._inputs(src, parts, dropped_ref), "k1",
                      self.partitions, bucket_firsts, reduce_returns=2, **self.retry)
        summaries = self._core([o[0] for o in out])
        dropped = np.unique(np.concatenate([s["dropped"] for s in summaries]))
        report = _report(block, rows, len(dropped), "duplicate")
        report["distinct"] = sum(s["buckets"] for s in summaries)
        return report, dropped, {}

    def fuzzy_dedup(self, block: Block, src: str, parts: list[dict], dropped_ref: Any,
                    rows: int) -> tuple[dict, np.ndarray, dict]:
        """Fuzzy dedup: signatures in map tasks, verified (band, key) buckets, clusters."""
        hasher = block.hasher  # type: ignore[attr-defined]
        seed = self.curate_cfg.minhash_seed if self.curate_cfg else 1
        args = (hasher.num_perm, hasher.ngram, seed, hasher.bands)
        verify = partial(bucket_firsts, threshold=block.threshold,  # type: ignore[attr-defined]
                         signatures=remote.PartSignatures(str(self.work),
                                                          [p["name"] for p in parts]))
        out = shuffle(remote.band_rows, self._inputs(src, parts, dropped_ref, args),
                      "k1", self.partitions, verify, reduce_returns=2, **self.retry)
        summaries = self._core([o[0] for o in out])
        dropped = np.unique(np.concatenate([s["dropped"] for s in summaries]))
        sizes = cluster_sizes(summaries, [o[1] for o in out])
        report = _report(block, rows, len(dropped), "near_duplicate")
        report |= {
            "clusters": sum(sizes.values()),
            "cluster_sizes": {str(k): v for k, v in sizes.items()},
            "indexed": sum(s["rows"] for s in summaries) // hasher.bands,
            "bands": hasher.bands, "rows": hasher.rows, "ngram": hasher.ngram,
            "threshold": block.threshold,  # type: ignore[attr-defined]
        }
        return report, dropped, {}


def _report(block: Block, docs_in: int, dropped: int, reason: str) -> dict:
    stats = BlockStats(block.name, docs_in=docs_in, docs_out=docs_in - dropped)
    if dropped:
        stats.dropped[reason] = dropped
    return stats.to_dict()


# Stateful block name → the RayStages method that runs it as a shuffle.
SHUFFLES: dict[str, Callable[..., tuple[dict, np.ndarray, dict]]] = {
    "exact_dedup": RayStages.exact_dedup,
    "fuzzy_dedup": RayStages.fuzzy_dedup,
}
