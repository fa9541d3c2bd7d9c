"""Parsers of settings: text (a flag, a hyperparameter) or a native value (YAML) -> the
value, or ValueError saying what is wrong (the caller names the setting). Shared by the
training configuration's table (train/config.py) and the models' own options (models/)."""

from __future__ import annotations

import math


def boolean(v):
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{v!r} is not true or false")


def number(kind, low=None, low_open=False, high=None, optional=False):
    def parse(v):
        if optional and (v is None or str(v).strip().lower() in ("", "none", "null")):
            return None
        if isinstance(v, bool):
            raise ValueError(f"{v!r} is not a number")
        try:
            x = kind(v) if kind is float or isinstance(v, int) else int(str(v).strip())
        except (TypeError, ValueError):
            raise ValueError(f"{v!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(x):
            raise ValueError(f"{v!r} is not a finite number")
        if low is not None and (x <= low if low_open else x < low):
            raise ValueError(f"{v} must be {'>' if low_open else '>='} {low}")
        if high is not None and x > high:
            raise ValueError(f"{v} must be <= {high}")
        return x
    return parse


def items(item, allow_scalar=False):
    """"400,400,400", "[400, 400]", a YAML list, or (allow_scalar) one value."""
    def parse(v):
        if isinstance(v, (list, tuple)):
            parts = list(v)
        else:
            parts = [p for p in str(v).strip().strip("[]()").split(",") if p.strip()]
        if not parts:
            raise ValueError(f"{v!r}: give one or more values")
        out = tuple(item(p) for p in parts)
        return out[0] if allow_scalar and len(out) == 1 and not isinstance(v, (list, tuple)) \
            and "," not in str(v) else out
    return parse


def drop_rate(v):
    x = number(float, 0)(v)
    if x >= 1:
        raise ValueError(f"{v} is not a drop rate in [0, 1)")
    return x


def choice(*allowed, lower=True):
    def parse(v):
        text = str(v).strip().lower() if lower else str(v).strip()
        if text not in allowed:
            raise ValueError(f"{v!r} is not one of {', '.join(allowed)}")
        return text
    return parse


def load_yaml(text: str):
    """YAML as yaml.safe_load reads it (no code runs), but a mapping that repeats a key is a
    ValueError naming the key and its line: safe_load keeps the last silently, so a spec
    holding `time_limit` twice would run under whichever came last."""
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:       # an unhashable key: the constructor names it
                continue
            if repeated:
                raise ValueError(f"line {key_node.start_mark.line + 1}: the key {key!r} is "
                                 "given twice")
        return loader.construct_mapping(node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=Strict)


def load_yaml_file(path, what: str):
    """A YAML file read by load_yaml, each way it can fail a ConfigError naming WHAT it was to
    be ("configuration file", "search space") and the file."""
    from pathlib import Path

    import yaml

    from .errors import ConfigError
    p = Path(path)
    try:
        return load_yaml(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {p} does not exist") from None
    except ValueError as e:     # a repeated key
        raise ConfigError(f"{what} {p}: {e}") from None
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {p} is not valid YAML: {str(e)[:200]}") from None
