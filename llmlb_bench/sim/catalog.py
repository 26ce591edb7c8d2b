"""Hardware and model catalogs: TOML data files read into typed records.

The built-in catalogs live in ``llmlb_bench/catalog/{gpus,models}.toml``;
users add or override entries with their own TOML files of the same shape
(``load_catalog(extra=[...])``), so a new GPU or model never needs code.
Every field is checked on load: a typo in a catalog is a one-line
:class:`UserError` naming the file, the entry and the field.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping, Protocol, Sequence, TypeVar

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import construct, unknown_choice

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class GPU:
    """One accelerator type (see the header of ``catalog/gpus.toml`` for units and sources)."""

    name: str
    description: str
    memory_gib: float
    bf16_tflops: float
    hbm_gb_s: float
    link_gb_s: float
    link_latency_us: float
    idle_w: float
    max_w: float
    price_per_hour: float
    compute_efficiency: float
    memory_efficiency: float
    step_overhead_ms: float
    layer_latency_us: float
    memory_power_fraction: float
    #: effective host<->GPU bandwidth per GPU, GB/s (KV swap to CPU); optional in user catalogs,
    #: where it defaults to PCIe Gen4 x16 (catalog/gpus.toml cites the figures)
    host_link_gb_s: float = 25.0
    #: how fast a busy GPU's power rises from the memory-bound floor to the limit with the tensor
    #: cores' busy share (see sim/cost.py ``_activity``); optional, default the H100 fit
    compute_power_scale: float = 0.27
    #: a busy GPU's dynamic power at SM clock c (a fraction of the maximum) is its full-clock power x
    #: (f + (1 - f) c ** clock_power_exponent), f = clock_invariant_power (HBM, memory controllers,
    #: leakage at the voltage floor); green knobs, sim/cost.py ``set_clock``. Optional, defaults 3, 0.4
    clock_power_exponent: float = 3.0
    clock_invariant_power: float = 0.4
    #: time per sampled sequence per step that the roofline's terms do not count (sampler over the
    #: vocabulary, per-request engine work), microseconds; sim/cost.py. Optional, default 0 (fitted
    #: for the built-in H100 and B200: catalog/gpus.toml)
    sequence_overhead_us: float = 0.0


@dataclass(frozen=True)
class Model:
    """One model's shape (see the header of ``catalog/models.toml``)."""

    name: str
    description: str
    params_b: float
    active_params_b: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    experts: int
    active_experts: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    weight_bytes: float
    kv_bytes: float
    max_context: int

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies across all layers (whole model, before TP sharding)."""
        if self.kv_lora_rank:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes


@dataclass(frozen=True)
class Catalog:
    gpus: Mapping[str, GPU]
    models: Mapping[str, Model]

    def gpu(self, name: str, where: str = "gpu") -> GPU:
        try:
            return self.gpus[name]
        except KeyError:
            raise unknown_choice("GPU", name, sorted(self.gpus), where) from None

    def model(self, name: str, where: str = "model") -> Model:
        try:
            return self.models[name]
        except KeyError:
            raise unknown_choice("model", name, sorted(self.models), where) from None


_FLOAT_POSITIVE = {"memory_gib", "bf16_tflops", "hbm_gb_s", "link_gb_s", "host_link_gb_s", "max_w", "params_b",
                   "active_params_b", "weight_bytes", "kv_bytes", "compute_power_scale", "clock_power_exponent"}
_FRACTION = {"compute_efficiency", "memory_efficiency", "memory_power_fraction", "clock_invariant_power"}


#: a catalog record
R = TypeVar("R", GPU, Model)


def _record(cls: type[R], name: str, raw: Mapping[str, object], where: str) -> R:
    """Build one record, checking field names, types and ranges."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UserError(f"entry {name!r} has unknown field {unknown[0]!r}", where)
    values: dict[str, object] = {"name": name}
    for fname, f in fields.items():
        if fname not in raw:
            if f.default is not dataclasses.MISSING:
                continue
            raise UserError(f"entry {name!r} is missing field {fname!r}", where)
        v = raw[fname]
        want = f.type if isinstance(f.type, str) else f.type.__name__
        number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if want == "str":
            ok = isinstance(v, str)
        elif want == "bool":
            ok = isinstance(v, bool)
        elif want == "int":
            ok = isinstance(v, int) and number is not None and number >= 0
        else:
            ok = number is not None and number >= 0
            v = number if ok else v
        if ok and fname in _FLOAT_POSITIVE:
            ok = number is not None and number > 0
        if ok and fname in _FRACTION:
            ok = number is not None and 0 < number <= 1
        if not ok:
            raise UserError(f"entry {name!r} field {fname!r} has bad value {raw[fname]!r} (expected {want}"
                            f"{', a fraction in (0, 1]' if fname in _FRACTION else ''})", where)
        values[fname] = v
    record = construct(cls, values)   # every value checked against its field's type above
    if isinstance(record, Model):
        _check_model(record, where)
    return record


def _check_model(m: Model, where: str) -> None:
    if m.layers < 1 or m.hidden < 1 or m.heads < 1 or m.kv_heads < 1 or m.head_dim < 1 or m.max_context < 1:
        raise UserError(f"entry {m.name!r} needs positive layers, hidden, heads, kv_heads, head_dim, max_context", where)
    if m.active_params_b > m.params_b:
        raise UserError(f"entry {m.name!r} has active_params_b > params_b", where)
    if m.is_moe != (m.active_experts > 0) or m.active_experts > m.experts:
        raise UserError(f"entry {m.name!r} needs 0 < active_experts <= experts for a MoE (both 0 when dense)", where)
    if m.is_moe and m.active_experts == m.experts and m.active_params_b != m.params_b:
        raise UserError(f"entry {m.name!r}: all experts active but active_params_b != params_b", where)


class _Text(Protocol):
    """A catalog file: a path, or the package's resource."""

    def read_text(self, encoding: str) -> str: ...


def _read_toml(source: _Text, where: str) -> dict[str, object]:
    try:
        doc: dict[str, object] = tomllib.loads(source.read_text(encoding="utf-8"))
        return doc
    except FileNotFoundError:
        raise UserError("no such file", where) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"not valid TOML ({exc})", where) from None


def _parse(source: _Text, where: str, gpus: dict[str, GPU], models: dict[str, Model], kind: str | None) -> None:
    """Read one catalog file. A built-in file holds one kind; a user file holds ``[gpus.*]`` / ``[models.*]``."""
    data = _read_toml(source, where)
    if kind is not None:
        data = {kind: data}
    unknown = sorted(set(data) - {"gpus", "models"})
    if unknown:
        raise UserError(f"unknown section {unknown[0]!r} (a catalog has [gpus.<name>] and [models.<name>] tables)",
                        where)
    gpus.update(_records(GPU, data, "gpus", where))
    models.update(_records(Model, data, "models", where))


def _records(cls: type[R], data: Mapping[str, object], section: str, where: str) -> dict[str, R]:
    """The records of one section of a catalog file (``[gpus.<name>]`` tables)."""
    tables = data.get(section, {})
    if not isinstance(tables, dict):
        raise UserError(f"{section} must hold [{section}.<name>] tables", where)
    out: dict[str, R] = {}
    for name, raw in tables.items():
        if not isinstance(raw, dict):
            raise UserError(f"{section} entry {name!r} is not a table", where)
        out[name] = _record(cls, name, raw, where)
    return out


@lru_cache(maxsize=16)
def _load(extra: tuple[str, ...]) -> Catalog:
    gpus: dict[str, GPU] = {}
    models: dict[str, Model] = {}
    base = resources.files("llmlb_bench") / "catalog"
    _parse(base / "gpus.toml", "llmlb_bench/catalog/gpus.toml", gpus, models, "gpus")
    _parse(base / "models.toml", "llmlb_bench/catalog/models.toml", gpus, models, "models")
    for path in extra:
        _parse(Path(path), path, gpus, models, None)
    return Catalog(gpus=gpus, models=models)


def load_catalog(extra: Sequence[str | Path] = ()) -> Catalog:
    """The built-in catalogs plus user files (later entries override earlier ones by name).

    A user file holds ``[gpus.<name>]`` and/or ``[models.<name>]`` tables with
    the same fields as the built-in files.
    """
    return _load(tuple(str(p) for p in extra))
