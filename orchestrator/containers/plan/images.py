"""The image agreement across hosts (PURE): the images existing containers run
(skew, stale tags) and what the tag resolves to on the hosts about to launch.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import ContainerConfig
from orchestrator.config.hostlist import MAX_NAMED_HOSTS as _MAX_NAMED_HOSTS
from orchestrator.config.hostlist import abbreviate_hosts as _names
from orchestrator.containers.inspection import short_id as _short
from orchestrator.containers.plan.model import (
    REBUILD,
    REBUILD_WAY,
    container_label,
    group,
    grouped_text,
)
from orchestrator.containers.probe import HostState
from orchestrator.errors import Phrase, Refusal, Text, WayOut


def image_problems(
    cfg: ContainerConfig, present: Mapping[str, HostState], *, no_launch: bool
) -> tuple[list[Refusal], list[Text]]:
    """(refusals, warnings) about the images of existing containers."""
    reasons: list[Refusal] = []
    warnings: list[Text] = []
    label = container_label(cfg)
    unreadable = [h for h, s in present.items() if not s.container_image_readable]
    if unreadable:
        reasons.append(
            Refusal(
                "image_unreadable",
                f"cannot read the image of {label} on {_names(unreadable)}",
                tuple(unreadable),
                (WayOut(f"check it with `{cfg.runtime} inspect` on those hosts"), REBUILD_WAY),
            )
        )
    readable = {h: s for h, s in present.items() if s.container_image_readable}
    groups = group((h, s.container_image_id or "?") for h, s in readable.items())
    if len(groups) > 1:
        reasons.append(
            Refusal(
                "image_skew",
                f"image skew: {label} runs different images across hosts: "
                f"{grouped_text(groups, _short)}; every host must run the same image",
                tuple(readable),
                (REBUILD_WAY,),
            )
        )
    stale = group(
        (h, s.tag_image_id)
        for h, s in readable.items()
        if s.tag_image_id is not None and s.tag_image_id != s.container_image_id
    )
    for tag_id, hosts in stale.items():
        running = {_short(present[h].container_image_id) for h in hosts}
        fix = (
            "recreate those containers to pick it up (no_launch: cvs does not)"
            if no_launch
            else Phrase("to rebuild: ", REBUILD)
        )
        warnings.append(
            Phrase(
                f"stale: {label} on {_names(hosts)} runs {', '.join(sorted(running))} but "
                f"{cfg.image} now resolves to {_short(tag_id)}; ",
                fix,
            )
        )
    return reasons, warnings


def check_tag_identity(
    states: Mapping[str, HostState], *, image: str | None = None
) -> list[Refusal]:
    """Refusal reasons unless the tag resolves to the same image on every host.

    Call it with the states probed after the pull/load step, for the hosts
    about to cold-start. Equal image IDs agree; so do differing IDs that share
    a repo digest (the same registry manifest can get different local IDs).
    """
    what = image or "the image"
    # The runtime the hosts were probed with (one per cluster): its verbs in the fix.
    rt = next((s.runtime_name for s in states.values()), "docker")
    reasons: list[Refusal] = []
    unknown = [h for h, s in states.items() if not s.known and s.tag_image_id is None]
    errors = [h for h, s in states.items() if s.tag_error and h not in unknown]
    missing = [
        h
        for h, s in states.items()
        if s.tag_image_id is None and h not in unknown and h not in errors
    ]
    if unknown:
        reasons.append(
            Refusal(
                "tag_unknown",
                f"cannot tell what {what} resolves to on {_names(unknown)} (probe failed)",
                tuple(unknown),
            )
        )
    if errors:
        detail = "; ".join(f"{h}: {states[h].tag_error}" for h in errors[:_MAX_NAMED_HOSTS])
        reasons.append(
            Refusal("tag_unreadable", f"cannot read {what} on {_names(errors)} ({detail})")
        )
    if missing:
        reasons.append(
            Refusal(
                "tag_missing",
                f"{what} is not present on {_names(missing)} after the pull step",
                tuple(missing),
                (
                    WayOut(
                        "pull or load it there (check `pull`, `image_tar` and `registry` in "
                        "the cluster file)"
                    ),
                ),
            )
        )
    have = {h: s for h, s in states.items() if s.tag_image_id is not None}
    groups = group((h, s.tag_image_id or "") for h, s in have.items())
    if len(groups) > 1:
        shared = set.intersection(*(set(s.tag_repo_digests) for s in have.values()))
        if not shared:
            reasons.append(
                Refusal(
                    "tag_identity",
                    f"{what} resolves to different images across hosts: "
                    f"{grouped_text(groups, _short)}",
                    tuple(have),
                    (
                        WayOut(
                            "make every host hold the same image (pull it from one registry, "
                            f"or `{rt} save` once and `{rt} load` on each host), then retry"
                        ),
                    ),
                )
            )
    return reasons


def pre_pull_tag_check(cfg: ContainerConfig, launching: Mapping[str, HostState]) -> list[Refusal]:
    # When the pull step cannot change anything (never pulls, or pulls only what
    # is missing and nothing is), the tag check can run now, before touching
    # any host. Otherwise the caller runs check_tag_identity after pulling.
    if not launching or cfg.pull == "always":
        return []
    if any(s.tag_image_id is None for s in launching.values()):
        return []
    return check_tag_identity(launching, image=cfg.image)
