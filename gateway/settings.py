"""Gateway configuration: every setting has a safe default and can be set as JOBGATE_<NAME>."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from nodeagent.protocol import MAX_COMMAND_TTL_S

REPO_POLICIES = Path(__file__).resolve().parent.parent / "policies"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JOBGATE_", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(Path("var"), description="Keys, SQLite files, blobs and demo tokens live here.")
    database_url: str | None = Field(None, description="Business DB; default: SQLite file in data_dir.")
    ledger_url: str | None = Field(None, description="Ledger store, never the business DB; default: SQLite.")
    ledger_origin: str = Field("jobgate.local/ledger", description="Origin line and signer name of checkpoints.")
    ledger_retention: str = Field(
        "forever",
        description="Stated retention of ledger entries; there is no API that deletes them (H3).",
    )
    policies_dir: Path = Field(REPO_POLICIES, description="The policy set security reviewers own.")
    policy_engine: Literal["embedded", "opa", "opa-inprocess"] = Field(
        "embedded", description="embedded regopy, an OPA server, or OPA's evaluator in-process.")
    opa_url: str | None = Field(None, description="OPA server URL when policy_engine is opa (http://host:8181).")
    opa_timeout_s: float = Field(1.0, gt=0, description="A decision OPA has not given by then is a deny.")
    policy_watch_interval_s: float = Field(1.0, ge=0, description="Policy dir polling period; 0 disables it.")
    host: str = "127.0.0.1"
    port: int = 8080
    node_heartbeat_timeout_s: float = Field(10.0, gt=0)
    node_names: str = Field(
        "*node*", description="Glob patterns (comma-separated) of the names nodes use: only a node enrolled by a "
                              "platform admin may take one; a service account never can (no squatting on a node's "
                              "name).")
    command_ttl_s: float = Field(300.0, gt=0, le=MAX_COMMAND_TTL_S,
                                 description="How long a signed node command stays valid (agents refuse longer).")
    scheduler_interval_s: float = Field(1.0, gt=0, description="Longest time between two scheduling cycles.")
    scheduler_max_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="Most of the wall time the scheduling cycles may take. A submission or a release starts a cycle"
        " at once, unless the last cycle was so long that a new one now would take more than this share: then it"
        " waits. Under a burst of submissions on a long queue, cycles back to back took two thirds of a replica's"
        " CPU from the requests.",
    )
    scheduler_planner: Literal["process", "thread"] = Field(
        "process",
        description="SQLite: where each scheduling cycle makes its plan (reads the queue, places, explains every"
        " waiting job): in a process of its own, which only reads the database, or in the scheduler loop's thread."
        " The plan is Python that holds the interpreter; in the loop's thread, the requests that came while it"
        " planned waited for it (gateway/native/planner_process.py). PostgreSQL plans in its thread.",
    )
    gil_switch_interval_s: float = Field(
        0.001,
        gt=0,
        le=0.1,
        description="How long one thread of the gateway may run Python before another that waits takes its turn"
        " (sys.setswitchinterval; Python's own is 0.005), set where the scheduling and housekeeping loops run beside"
        " the requests. A request gives the interpreter up at every database call and waits for it back; while a"
        " cycle planned a long queue, each such wait took up to the whole interval. With 1,750 jobs queued,"
        " approvals at 10/s had a p99 of 92-159 and 97-115 ms at Python's interval, 38-57 and 49-86 ms at 1 ms"
        " (two runs of each, interleaved).",
    )
    max_long_poll_s: float = Field(30.0, gt=0)
    service_token_max_days: int = Field(90, gt=0)
    api_threads: int = Field(
        8,
        ge=1,
        description="Worker threads that run API calls. CPython runs one thread at a time, so a few threads"
        " keep latency low under load where many would take turns; agents' long polls have their own pool.",
    )
    auth_cache_s: float = Field(
        5.0,
        ge=0,
        description="How long a token's facts are reused without a DB read. A revocation through this gateway"
        " applies at once; one through another replica within this time. 0 turns the cache off.",
    )
    alert_webhook_url: str | None = Field(None, description="POSTed a JSON alert on every break-glass use (F3).")
    rate_limit_storage: str = Field(
        "memory://", description="`limits` storage URI; redis://host:6379 shares counts across replicas."
    )
    database_lock_timeout_s: float = Field(
        30.0, gt=0, description="PostgreSQL: how long a request waits for a row or table lock before it is refused"
        " (503) rather than holding an API thread while another session keeps the lock.",
    )
    refusal_window_s: float = Field(
        60.0, ge=0, description="Identical refusals of one caller within this many seconds after one in the ledger"
        " are counted into one later entry instead of each being written; 0 writes every one.",
    )
    rate_limit_timeout_s: float = Field(
        1.0, gt=0, description="How long a mutating call waits for the rate-limit storage (Redis) before it is"
        " refused as counts unavailable.",
    )

    backend: Literal["native", "slurm"] = Field(
        "native", description="What runs the jobs: jobgate's own scheduler and node agents, or a Slurm cluster.")
    slurm_conf: Path = Field(Path("/etc/slurm/slurm.conf"), description="The Slurm cluster's slurm.conf (backend "
                             "slurm; the client commands get it as SLURM_CONF). JOBGATE_SLURM_CONF, else SLURM_CONF.",
                             validation_alias=AliasChoices("JOBGATE_SLURM_CONF", "SLURM_CONF", "slurm_conf"))
    slurm_service_user: str | None = Field(None, description="Unix user jobgate acts as in Slurm, the cluster's only "
                                   "Operator; default: the gateway process's own user.")
    slurm_cluster: str | None = Field(None, description="Name of the cluster in jobgate's map of Slurm jobs; "
                                      "default: ClusterName in slurm.conf.")
    slurm_rest_url: str | None = Field(None, description="slurmrestd URL (optional, reads only; the commands are "
                                       "used for every change).")
    slurm_jwt_key: Path | None = Field(None, description="HS256 key to sign slurmrestd tokens with (with "
                                       "slurm_rest_url).")
    slurm_checkpoint_dir: Path | None = Field(None, description="Storage shared by the gateway and every Slurm "
                                              "node where jobs write checkpoints; default: data_dir/slurm-checkpoints.")
    slurm_timeout_s: float = Field(30.0, gt=0, description="Bound on one Slurm command (its clients retry an "
                                   "absent controller for MessageTimeout seconds first).")
    slurm_poll_interval_s: float = Field(1.0, gt=0, description="How often jobgate reads Slurm's queue.")
    slurm_watch_interval_s: float = Field(3.0, gt=0, description="How often jobgate looks for acts done in Slurm "
                                          "behind its back and jobs submitted straight to it, and sets its quotas "
                                          "on Slurm's associations (one reconciliation cycle).")

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'jobgate.db').resolve()}"

    def resolved_ledger_url(self) -> str:
        return self.ledger_url or f"sqlite:///{(self.data_dir / 'ledger.db').resolve()}"

    @property
    def keys_dir(self) -> Path:
        return self.data_dir / "keys"


def settings_refused(error: ValidationError) -> str:
    """The settings refused, one clause each: the setting, the variable that sets it, the value given and why."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    clauses = []
    for problem in error.errors():
        name = ".".join(str(part) for part in problem["loc"])
        variable = name.upper() if name.upper().startswith(prefix) else f"{prefix}{name}".upper()  # (an alias)
        clauses.append(f"{name} ({variable}) = {problem.get('input')!r}: {problem['msg']}")
    return "invalid setting " + "; ".join(clauses)
