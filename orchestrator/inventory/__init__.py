"""The inventory: which hosts exist, how to reach them, and what each is for (docs/inventory.md).

A setting is one line in a key table and one field on its dataclass; a job setting an eval
role sets is declared in the contract alone (`remote.protocol.job_spec.setting`).
"""

from orchestrator.inventory.load import (
    DEFAULT_FILE,
    ENV_VAR,
    EXAMPLE_FILE,
    find_inventory_path,
    load_inventory,
    locate_inventory,
    parse_inventory,
)
from orchestrator.inventory.schema import (
    DEFAULT_KEYS,
    HOST_KEYS,
    HOST_REFERENCES,
    ROLE_KEYS,
)
from orchestrator.inventory.spec import (
    Defaults,
    EvalRole,
    HostSpec,
    Inventory,
    InventoryError,
    TrainerRole,
    default_python,
)

__all__ = [
    "DEFAULT_FILE",
    "ENV_VAR",
    "EXAMPLE_FILE",
    "find_inventory_path",
    "load_inventory",
    "locate_inventory",
    "parse_inventory",
    "DEFAULT_KEYS",
    "HOST_KEYS",
    "HOST_REFERENCES",
    "ROLE_KEYS",
    "Defaults",
    "EvalRole",
    "HostSpec",
    "Inventory",
    "InventoryError",
    "TrainerRole",
    "default_python",
]
