"""Fleets: which profile each instance of a cluster runs.

A fleet is an ordered list of ``(profile, count)`` entries; instance ``i`` runs the profile of the entry it
falls in (``Fleet.profiles()``), so ``a100:2,l4:2`` is instances 0-1 on the A100 profile and 2-3 on the L4
one. A uniform fleet is the one-entry case. On the command line a fleet is written
``NAME_OR_PATH:COUNT[:ROLE][,...]`` (``parse_fleet``; ``Fleet.spec()`` writes it back), where each profile
is a shipped profile's name or a path to a profile TOML file. One fleet serves one model: profiles naming
different models are refused.

Roles, for prefill/decode disaggregation: ``mixed`` (the default: prefills and decodes, as every instance did
before roles), ``prefill`` (runs prompts; their KV moves to a decode instance) and ``decode`` (takes the KV and
decodes; it can also serve a request whole). A fleet with a ``prefill`` instance needs one that decodes
(``decode`` or ``mixed``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from .core import InstanceSpec
from .errors import InputError
from .profiles import Profile, ProfileError, available_profiles, load_profile


class FleetError(InputError):
    """A fleet spec that cannot be used; the message is one line naming the entry at fault."""


#: an instance's part in prefill/decode disaggregation (``mixed``: both, the default)
ROLES = ("mixed", "prefill", "decode")


class FleetEntry(NamedTuple):
    profile: Profile
    count: int
    role: str = "mixed"


@dataclass(frozen=True)
class Fleet:
    entries: tuple[FleetEntry, ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise FleetError("fleet: no entries (give NAME_OR_PATH:COUNT[,NAME_OR_PATH:COUNT...])")
        for e in self.entries:
            if isinstance(e.count, bool) or not isinstance(e.count, int) or e.count <= 0:
                raise FleetError(f"fleet: entry {_entry(e)!r}: count must be a positive integer, not {e.count!r}")
            if e.role not in ROLES:
                raise FleetError(f"fleet: entry {_entry(e)!r}: unknown role {e.role!r} (choose from "
                                 f"{', '.join(ROLES)})")
        first = self.entries[0]
        for e in self.entries[1:]:
            if e.profile.model and first.profile.model and e.profile.model != first.profile.model:
                raise FleetError(f"fleet: entry {_entry(e)!r}: model {e.profile.model!r} differs from "
                                 f"{first.profile.model!r} of entry {_entry(first)!r} "
                                 "(one fleet serves one model)")
        roles = {e.role for e in self.entries}
        if "prefill" in roles and roles == {"prefill"}:
            raise FleetError(f"fleet: {self.spec()!r} has prefill instances but none that decodes "
                             "(add NAME:COUNT:decode or NAME:COUNT:mixed)")

    @classmethod
    def uniform(cls, profile: Profile, n: int) -> "Fleet":
        """``n`` instances of one profile."""
        return cls((FleetEntry(profile, n),))

    @property
    def num_instances(self) -> int:
        return sum(e.count for e in self.entries)

    @property
    def is_uniform(self) -> bool:
        """Whether every instance runs the same profile."""
        return all(e.profile == self.entries[0].profile for e in self.entries[1:])

    def profiles(self) -> list[Profile]:
        """One profile per instance, in instance order."""
        return [e.profile for e in self.entries for _ in range(e.count)]

    def roles(self) -> list[str]:
        """One role per instance, in instance order."""
        return [e.role for e in self.entries for _ in range(e.count)]

    @property
    def is_disaggregated(self) -> bool:
        """Whether some instance has a role other than ``mixed`` (prefill/decode disaggregation)."""
        return any(e.role != "mixed" for e in self.entries)

    def instance_specs(self) -> list[InstanceSpec]:
        """One ``InstanceSpec`` per instance, in instance order (what the routers see)."""
        out: list[InstanceSpec] = []
        for e in self.entries:
            spec = e.profile.instance_spec()
            out += [spec if e.role == "mixed" else replace(spec, role=e.role)] * e.count
        return out

    def spec(self) -> str:
        """The fleet as ``parse_fleet`` reads it (profiles by shipped name, else by file path; a profile
        built in memory, with no file, is written by name)."""
        return ",".join(_entry(e) for e in self.entries)

    @property
    def label(self) -> str:
        """A short name for tables: ``llama3.1-8b-a100x4``; mixed fleets drop the profiles' common
        dash-separated prefix, ``a100x2+l4x2``."""
        names = [e.profile.name for e in self.entries]
        if len(set(names)) > 1:
            prefix = _common_dash_prefix(names)
            names = [n[len(prefix):] for n in names]
        return "+".join(f"{n}x{e.count}" + ("" if e.role == "mixed" else f"-{e.role}")
                        for n, e in zip(names, self.entries))

    def to_toml_dict(self) -> dict[str, Any]:
        """The fleet for ``run.toml``: its spec (``from_toml_dict`` reads it back) and one table per entry."""
        entries = []
        for e in self.entries:
            row: dict[str, Any] = {"profile": e.profile.name, "count": e.count, "model": e.profile.model,
                                   "hardware": e.profile.hardware}
            if e.profile.path is not None:
                row["path"] = e.profile.path
            if e.role != "mixed":
                row["role"] = e.role
            entries.append(row)
        return {"spec": self.spec(), "label": self.label, "num_instances": self.num_instances,
                "entries": entries}

    @classmethod
    def from_toml_dict(cls, data: dict[str, Any]) -> "Fleet":
        return parse_fleet(str(data["spec"]))


def split_role(ref: str) -> tuple[str, str]:
    """``PROFILE:ROLE`` (an attached endpoint's ``URL@PROFILE:ROLE``) -> ``(PROFILE, ROLE)``; a ``PROFILE`` with
    no known role after its last colon -> ``(PROFILE, "mixed")``."""
    head, sep, role = ref.rpartition(":")
    return (head.strip(), role.strip()) if sep and head.strip() and role.strip() in ROLES else (ref, "mixed")


def parse_fleet(text: str) -> Fleet:
    """``"llama3.1-8b-a100:2,llama3.1-8b-l4:2"`` or ``"llama3.1-8b-h100:2:prefill,llama3.1-8b-a100:4:decode"``
    → a ``Fleet``; raises ``FleetError``."""
    if not text.strip():
        raise FleetError("fleet: empty spec (give NAME_OR_PATH:COUNT[,NAME_OR_PATH:COUNT...])")
    entries = []
    for k, raw in enumerate(text.split(",")):
        entry = raw.strip()
        if not entry:
            raise FleetError(f"fleet: entry {k + 1} of {text.strip()!r} is empty")
        ref, sep, count_text = entry.rpartition(":")
        ref, count_text = ref.strip(), count_text.strip()
        role = "mixed"
        head, sep2, maybe_count = ref.rpartition(":")
        if sep2 and head.strip() and maybe_count.strip().isdigit() and not count_text.isdigit():
            ref, role, count_text = head.strip(), count_text, maybe_count.strip()  # NAME:COUNT:ROLE
            if role not in ROLES:
                raise FleetError(f"fleet: entry {entry!r}: unknown role {role!r} (choose from {', '.join(ROLES)})")
        if not sep or not ref or not count_text:
            raise FleetError(f"fleet: entry {entry!r}: not NAME_OR_PATH:COUNT")
        try:
            count = int(count_text)
        except ValueError:
            raise FleetError(f"fleet: entry {entry!r}: count {count_text!r} is not an integer") from None
        if count <= 0:
            raise FleetError(f"fleet: entry {entry!r}: count must be a positive integer, not {count}")
        try:
            profile = load_profile(ref)
        except ProfileError as exc:
            if not Path(ref).is_file():
                known = ", ".join(available_profiles()) or "none"
                raise FleetError(f"fleet: entry {entry!r}: unknown profile {ref!r} (known: {known}; or a "
                                 "path to a .toml file)") from None
            detail = " ".join(str(exc).split())
            raise FleetError(f"fleet: entry {entry!r}: {detail}") from None
        entries.append(FleetEntry(profile, count, role))
    return Fleet(tuple(entries))


def _entry(e: FleetEntry) -> str:
    return f"{_ref(e.profile)}:{e.count}" + ("" if e.role == "mixed" else f":{e.role}")


def _ref(profile: Profile) -> str:
    """How a spec names a profile: its shipped name when that name loads this very profile, else its path."""
    shipped = available_profiles().get(profile.name)
    if shipped is not None and (profile.path is None or Path(profile.path).resolve() == shipped.resolve()):
        return profile.name
    return profile.path or profile.name


def _common_dash_prefix(names: list[str]) -> str:
    parts = [n.split("-") for n in names]
    common: list[str] = []
    for pieces in zip(*(p[:-1] for p in parts)):
        if len(set(pieces)) != 1:
            break
        common.append(pieces[0])
    return "-".join(common) + "-" if common else ""
