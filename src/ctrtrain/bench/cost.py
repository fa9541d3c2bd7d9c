"""What a benchmark cell would cost: the hourly price of its instances (an editable price
table), per million examples at its measured throughput, and to train a given number of
examples (default: one epoch of Criteo's 45.8M training rows)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError

DEFAULT_PRICES = Path(__file__).parent / "data" / "prices.yaml"


def load_prices(path: str | None = None) -> dict:
    p = Path(path) if path else DEFAULT_PRICES
    try:
        table = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"price table {p}: {e}") from e
    if not isinstance(table, dict) or not isinstance(table.get("instances"), dict):
        raise ConfigError(f"price table {p}: needs an `instances` mapping")
    return table


def hourly(cell: dict, prices: dict) -> float:
    """USD per hour of the cell's instances (training hosts, plus its data-service host)."""
    inst = prices["instances"]
    groups = [(cell["instance_type"], cell["hosts"])]
    if cell.get("data_service"):
        groups.append((cell["data_instance_type"], 1))
    total = 0.0
    for itype, n in groups:
        if itype not in inst:
            raise ConfigError(f"no price for instance type {itype!r} in the price table")
        total += n * float(inst[itype]["usd_per_hour"])
    return total


def cost(cell: dict, examples_per_s: float, prices: dict, train_examples: float) -> dict:
    usd_h = hourly(cell, prices)
    hours = train_examples / examples_per_s / 3600
    return {"usd_per_hour": usd_h,
            "usd_per_million_examples": usd_h / (examples_per_s * 3600) * 1e6,
            "hours_to_train": hours, "usd_to_train": usd_h * hours}
