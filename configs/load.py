"""Load a config: schema defaults, then YAML files in order, then ``key=value`` overrides.

Every source is merged on its own so that an error names the source as well as the key,
the expected type, and the closest valid key.
"""
from __future__ import annotations

import difflib
from dataclasses import fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from configs.schema import Config


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key, the source and the fix."""


def packaged_config_dir() -> Path:
    return Path(str(resources.files("configs")))


def shipped_configs() -> dict[str, str]:
    """Each shipped config's name and what it is for (its first comment line); defaults.yaml,
    the schema's generated defaults, is what every config starts from, not one to pick."""
    about = {}
    for path in sorted(packaged_config_dir().glob("*.yaml")):
        if path.stem != "defaults":
            first = path.read_text().splitlines()[0] if path.read_text() else ""
            about[path.stem] = first.lstrip("# ").split(":")[0].rstrip(".") if first.startswith("#") else ""
    return about


def resolve_config_path(name: str) -> Path:
    """A path as given, or the name of a shipped config (``cpu-demo`` -> configs/cpu-demo.yaml)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = packaged_config_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if shipped.exists():
        return shipped
    available = sorted(p.stem for p in packaged_config_dir().glob("*.yaml"))
    raise ConfigError(f"config file {name!r} not found; shipped configs: {', '.join(available)}")


def load_config(
    files: Iterable[str] = (), overrides: Iterable[str] = (), require_complete: bool = True, schema: type = Config
) -> DictConfig:
    """The merged, type-checked config. ``require_complete`` rejects schema fields left MISSING (``???``)."""
    cfg = OmegaConf.structured(schema)
    for name in files:
        path = resolve_config_path(name)
        try:
            data = OmegaConf.load(path)
        except Exception as err:  # YAML syntax errors come in several exception types
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(data, DictConfig):
            raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, env:, ...)")
        cfg = _merge(cfg, data, str(path), schema)
    overrides = list(overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. rollout.max_turns=20)")
    if overrides:
        cfg = _merge(cfg, OmegaConf.from_dotlist(overrides), "command line", schema)
    if require_complete:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"required config value(s) not set: {', '.join(missing)}; set them in a file or as key=value")
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot resolve an interpolation: {_first_line(err)}") from err
    if schema is Config:
        for key in RUN_FOLDERS:
            OmegaConf.update(cfg, key, under_root(cfg, OmegaConf.select(cfg, key)))
    return cfg


RUN_FOLDERS = ("logging.out_dir", "eval.out_dir", "synth.out_dir")  # relative ones go under storage.root


def under_root(cfg: DictConfig, folder: str) -> str:
    """A run folder under storage.root, unless it is absolute or the root is the current folder."""
    root = str(cfg.storage.root)
    if root in ("", ".") or Path(folder).expanduser().is_absolute():
        return folder
    return str(Path(root).expanduser() / folder)


def _merge(cfg: DictConfig, data: DictConfig, source: str, schema: type = Config) -> DictConfig:
    _check_sections(OmegaConf.to_container(data, resolve=False), source, schema)
    try:
        return OmegaConf.merge(cfg, data)
    except ConfigKeyError as err:
        key = getattr(err, "full_key", "") or _first_line(err)
        raise ConfigError(f"{source}: unknown config key {key!r}{_suggestion(key)}") from err
    except (ValidationError, MissingMandatoryValue) as err:
        key = getattr(err, "full_key", "")
        choices = _choices(key)
        if choices:  # OmegaConf's own text lists them in brackets, in upper case: ours names them as typed
            raise ConfigError(f"{source}: bad value {getattr(err, 'value', None)!r} for {key!r}: expected one of "
                              f"{', '.join(choices)}") from err
        raise ConfigError(
            f"{source}: bad value for {key!r}: expected {_expected_type(key)}; {_first_line(err)}"
        ) from err


def _check_sections(data: Any, source: str, cls: type = Config, prefix: str = "") -> None:
    """A section (``rollout:``) given a value or left empty: OmegaConf's error names no key
    ("bad value for None ... int is not a subclass of RolloutConfig"), so the section is named here."""
    if not isinstance(data, dict):
        return
    for f in fields(cls):
        if f.name not in data or not callable(f.default_factory):
            continue
        section = f.default_factory()
        if not is_dataclass(section):
            continue
        value, name = data[f.name], f"{prefix}{f.name}"
        if isinstance(value, dict):
            _check_sections(value, source, type(section), f"{name}.")
            continue
        example = next(iter(valid_keys(type(section), f"{name}.")))
        given = "is empty" if value is None else f"is a section, not a value (given {value!r})"
        raise ConfigError(f"{source}: {name!r} {given}: set its keys ({example}=... on the command line; in a file, "
                          f"'{example.rsplit('.', 1)[1]}: ...' indented under '{f.name}:'), or remove it; "
                          f"`cuda-agent config show` lists them")


def valid_keys(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of the schema, dotted, with its annotation."""
    keys: dict[str, Any] = {}
    for f in fields(cls):
        ftype = f.default_factory() if f.default_factory is not Ellipsis and callable(f.default_factory) else None
        if ftype is not None and is_dataclass(ftype):
            keys.update(valid_keys(type(ftype), f"{prefix}{f.name}."))
        else:
            keys[f"{prefix}{f.name}"] = f.type
    return keys


def _suggestion(key: str) -> str:
    close = difflib.get_close_matches(key, list(valid_keys()), n=1, cutoff=0.5)
    if not close:
        section = key.split(".")[0]
        close = [k for k in valid_keys() if k.startswith(section + ".")][:1]
        return f"; valid keys in {section!r} include {close[0]!r} (see `cuda-agent config show`)" if close else ""
    return f"; did you mean {close[0]!r}?"


def _choices(key: str) -> list[str]:
    """The values an enum-typed key takes, as a user types them ([] for any other key)."""
    from configs import schema

    enum = getattr(schema, str(valid_keys().get(key)), None)
    return list(enum.__members__) if isinstance(enum, type) and hasattr(enum, "__members__") else []


def _expected_type(key: str) -> str:
    annotation = valid_keys().get(key)
    if annotation is None:
        return "a valid value"
    choices = _choices(key)
    return "one of " + ", ".join(choices) if choices else str(annotation)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
