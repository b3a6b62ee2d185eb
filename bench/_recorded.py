"""Recorded measurements for the model's rank correlation and the simulated search:
every timed candidate of the Optuna studies in artifacts/studies.db and of the exhaustive
grid in bench/results/search-quality-exhaustive-*.json (or .json.gz: the larger records are
committed gzipped), with its measured TFLOP/s and ptxas's registers and shared memory (CPU
only; nothing here touches a GPU)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sqlite3
from pathlib import Path

from _common import gpu_slug

ROOT = Path(__file__).resolve().parent.parent
STUDIES_DB = ROOT / "artifacts" / "studies.db"
EXHAUSTIVE = sorted(p for p in (ROOT / "bench" / "results").glob("search-quality-exhaustive-*")
                    if p.name.endswith((".json", ".json.gz")))


def read_json(path) -> dict:
    """A result record, gzipped (.gz) or not."""
    path = Path(path)
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
                      else path.read_text())
#: fresh tunes' studies, saved from the studies.db a GPU machine brought back
#: (bench/model_rank.py --studies-db DB --save-studies PATH)
TUNE_STUDIES = sorted((ROOT / "bench" / "results").glob("tune-studies-*.json"))


@dataclasses.dataclass(frozen=True)
class Point:
    kernel: str
    tflops: float
    registers: int
    smem: int
    spill_bytes: int = 0


@dataclasses.dataclass
class Study:
    name: str  # where it came from
    shape: tuple[int, int, int]
    dtype: str
    points: list[Point]
    exhaustive: bool = False
    valid: int | None = None  # the grid's size, for an exhaustive record
    untimed: list[Point] = dataclasses.field(default_factory=list)  # pruned, with resources
    families: frozenset[str] | None = None  # the families a grid covered (None: all)
    variant: str | None = None  # the problem's Variant key (None: the plain problem)
    gpu: str | None = None  # the GPU that timed it (None: not recorded)


def _shape(text: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in text.split("x"))
    return m, n, k


def from_studies_db(db: Path = STUDIES_DB) -> list[Study]:
    """Each study's completed trials (kernel, value, figures.registers / smem)."""
    if not db.is_file():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = []
    for sid, name in con.execute("select study_id, study_name from studies order by study_id"):
        parts = name.split("|")
        dtype, shape = parts[4], _shape(parts[6])
        rows = con.execute(
            "select t.trial_id, v.value from trials t join trial_values v "
            "on v.trial_id = t.trial_id where t.study_id = ? and t.state = 'COMPLETE'", (sid,))
        pts: dict[str, Point] = {}
        for tid, value in rows.fetchall():
            attrs = {k: json.loads(v) for k, v in con.execute(
                "select key, value_json from trial_user_attributes where trial_id = ?", (tid,))}
            f = attrs.get("figures") or {}
            kernel = attrs.get("kernel")
            if not kernel or "registers" not in f or attrs.get("duplicate_of"):
                continue
            pts[kernel] = Point(kernel, float(value), int(f["registers"]), int(f["smem"]),
                                int(f.get("spill_bytes", 0)))
        out.append(Study(f"studies.db#{sid} {parts[3]}", shape, dtype, list(pts.values()),
                         gpu=parts[0]))
    return out


def from_exhaustive(paths=EXHAUSTIVE) -> list[Study]:
    out = []
    for p in paths:
        d = read_json(p)
        ex = d["exhaustive"]
        pts, untimed = [], []
        for r in ex["records"]:
            res = r.get("resources")
            if not res:
                continue
            pt = Point(r["kernel"], float(r["tflops"] or 0.0), int(res["registers"]),
                       int(res["smem_static"] + res["smem_dynamic"]),
                       int(res["spill_stores"] + res["spill_loads"]))
            (pts if r["outcome"] == "timed" else untimed).append(pt)
        fam = ex.get("families")
        out.append(Study(f"{Path(p).name}", _shape(d["shape"]), d["dtype"], pts, True,
                         ex["valid"], untimed, frozenset(fam) if fam else None,
                         d.get("variant"), d.get("gpu")))
    return out


def recorded_gpu(studies: list[Study]) -> str:
    """The GPUs that timed `studies`, in a line ("NVIDIA H100 80GB HBM3, NVIDIA H200")."""
    return ", ".join(sorted({s.gpu for s in studies if s.gpu})) or "unknown"


def recorded_slug(studies: list[Study]) -> str:
    """recorded_gpu as a result file's name carries it ("h100-80gb-hbm3-h200")."""
    return "-".join(sorted({gpu_slug(s.gpu) for s in studies if s.gpu})) or "unknown"


def save_tune_studies(studies: list[Study], path: Path, **meta) -> None:
    """`studies` (a tune's, from from_studies_db) as JSON: `meta` (date, commit), the GPU
    that timed them (from their study names) and each study's timed kernels with their
    figures, which from_tune_studies reads back."""
    doc = dict(meta, gpu=recorded_gpu(studies),
               studies=[dict(name=s.name, shape="x".join(map(str, s.shape)), dtype=s.dtype,
                             points=[dataclasses.asdict(p) for p in s.points])
                        for s in studies])
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def from_tune_studies(paths=TUNE_STUDIES) -> list[Study]:
    out = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        out += [Study(f"{Path(p).name}#{i} {s['name']}", _shape(s["shape"]), s["dtype"],
                      [Point(**pt) for pt in s["points"]], gpu=d.get("gpu"))
                for i, s in enumerate(d["studies"])]
    return out


def all_studies(extra_dbs=()) -> list[Study]:
    """The exhaustive grids, artifacts/studies.db's studies, fresh tunes' saved studies
    (bench/results/tune-studies-*.json), and those of `extra_dbs` (a tune's studies.db
    brought back from a GPU machine: bench/device_steps.sh tunes)."""
    return from_exhaustive() + from_studies_db() + from_tune_studies() + [
        s for db in extra_dbs for s in from_studies_db(Path(db))]
