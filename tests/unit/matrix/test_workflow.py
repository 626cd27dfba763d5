"""``ci/github/kernels.yml`` (structure + actionlint) and ``ci/fresh_machine_check.sh``.

The tests of this topic that start processes are in
``tests/scenarios/matrix/test_workflow.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from metrale_orch import matrix as mx
from metrale_orch.config import ENV_VARS
from tests.support.matrix import WORKFLOW

#: The keys of a matrix row, from the code that writes them.
ROW_KEYS = set(
    mx.MatrixRow(
        hw="h",
        shard=1,
        shards=1,
        runner=mx.RunnerClass(name="r", labels=("x",)),
        placement=mx.Placement.both("r"),
        toolchain="nvcc",
        targets=(),
        modules=0,
        seconds=None,
        build="",
        smoke="",
    ).to_dict()
)


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    steps = job["steps"]
    assert isinstance(steps, list)
    return steps


def _step(job: dict[str, Any], name: str) -> dict[str, Any]:
    (step,) = [s for s in _steps(job) if s.get("name") == name]
    return step


def _uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in _steps(job) if str(s.get("uses", "")).startswith(action + "@")]


# --------------------------------------------------------------------------- structure


def test_triggers_and_permissions(workflow: dict[Any, Any]) -> None:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert isinstance(on, dict)
    assert {"push", "pull_request"} <= set(on)
    assert workflow["permissions"] == {"contents": "read"}
    assert set(workflow["jobs"]) == {"plan", "build", "keep-times", "smoke"}


def test_plan_job_exposes_the_matrix(workflow: dict[Any, Any]) -> None:
    plan = workflow["jobs"]["plan"]
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    assert plan["outputs"]["smoke-matrix"] == "${{ steps.plan.outputs.smoke-matrix }}"
    (step,) = [s for s in _steps(plan) if s.get("id") == "plan"]
    script = step["run"]
    assert "metrale-orch matrix --runners ci/runners.toml" in script
    assert "--smoke-rows" in script
    for output in ("matrix", "rows", "smoke-matrix", "smoke-rows"):
        assert f'echo "{output}=' in script
    assert '>> "$GITHUB_OUTPUT"' in script
    assert _uses(plan, "actions/checkout")


@pytest.mark.parametrize(("job_name", "output"), [("build", "matrix"), ("smoke", "smoke-matrix")])
def test_row_jobs_run_on_the_rows_runner_with_the_shared_cache(
    workflow: dict[Any, Any], job_name: str, output: str
) -> None:
    job = workflow["jobs"][job_name]
    assert "plan" in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"])
    assert job["strategy"]["matrix"] == f"${{{{ fromJSON(needs.plan.outputs.{output}) }}}}"
    assert job["strategy"]["fail-fast"] is False
    assert job["runs-on"] == "${{ matrix.runs-on }}"
    env = job["env"]
    assert env["METRALE_ORCH_CACHE"] == "${{ vars.METRALE_ORCH_CACHE }}"
    mode = env["METRALE_ORCH_CACHE_MODE"]
    assert "github.event.pull_request.head.repo.fork" in mode
    assert "'read-only'" in mode and "'read-write'" in mode
    assert mode.index("fork &&") < mode.index("'read-only'")  # fork -> read-only
    assert env["AWS_ACCESS_KEY_ID"] == "${{ secrets.AWS_ACCESS_KEY_ID }}"
    assert env["AWS_SECRET_ACCESS_KEY"] == "${{ secrets.AWS_SECRET_ACCESS_KEY }}"
    gcs = _step(job, "GCS credentials")
    assert gcs["env"]["GCP_KEY"] == "${{ secrets.GOOGLE_APPLICATION_CREDENTIALS }}"
    assert "GOOGLE_APPLICATION_CREDENTIALS=" in gcs["run"] and "$GITHUB_ENV" in gcs["run"]
    steps = [s.get("name", s.get("uses")) for s in _steps(job)]
    assert steps.index("Install") < steps.index("Smoke") < steps.index("Upload reports")

    smoke = _step(job, "Smoke")
    assert smoke["env"]["SMOKE_TASK"] == "${{ matrix.smoke }}"
    assert smoke["run"] == 'doit "$SMOKE_TASK"'
    assert "matrix.toolchain-available" in smoke["if"]

    (upload,) = _uses(job, "actions/upload-artifact")
    assert upload["if"] == "always()"
    assert upload["uses"] == "actions/upload-artifact@v6"
    paths = upload["with"]["path"].strip().splitlines()
    assert paths[:2] == ["build/smoke-${{ matrix.hw }}.xml", "build/cache-stats.json"]
    assert "${{ matrix.id }}" in upload["with"]["name"]  # unique per row, no '/'

    summary = _step(job, "Summary")
    assert summary["if"] == "always()"
    assert '>> "$GITHUB_STEP_SUMMARY"' in summary["run"]
    assert "metrale-orch cache stats" in summary["run"]


def test_the_compile_times_go_round_through_the_actions_cache(workflow: dict[Any, Any]) -> None:
    jobs = workflow["jobs"]
    # The build rows upload what they kept (.state is hidden: upload-artifact skips it
    # unless told), ...
    (upload,) = _uses(jobs["build"], "actions/upload-artifact")
    assert "build/.state/target-times.json" in upload["with"]["path"].splitlines()
    assert upload["with"]["include-hidden-files"] is True
    # ... the keep-times job, after every row, merges it into the kept file and saves it ...
    keep = jobs["keep-times"]
    assert set(keep["needs"]) == {"plan", "build"} and "!cancelled()" in keep["if"]
    steps = [s.get("name", s.get("uses")) for s in _steps(keep)]
    order = ["Restore the kept compile times", "Download the build rows' reports"]
    order += ["Merge the compile times", "Save the kept compile times"]
    assert [n for n in steps if n in order] == order
    (download,) = _uses(keep, "actions/download-artifact")
    assert download["with"]["pattern"] == "kernels-*"
    merge = _step(keep, "Merge the compile times")["run"]
    assert merge == f"metrale-orch matrix --keep-times {download['with']['path']}"
    (save,) = _uses(keep, "actions/cache/save")
    # ... and the next plan restores it before it computes the matrix.
    (restore,) = _uses(jobs["plan"], "actions/cache/restore")
    plan_steps = [s.get("name") for s in _steps(jobs["plan"])]
    assert plan_steps.index(restore["name"]) < plan_steps.index("Compute the matrix")
    for got in (restore, *_uses(keep, "actions/cache/restore")):
        assert got["with"]["path"] == save["with"]["path"] == "build/.state/target-times.json"
        assert got["with"]["restore-keys"] == "metrale-orch-times-"
        assert got["with"]["key"] == save["with"]["key"]
    assert save["with"]["key"].startswith("metrale-orch-times-")


def test_build_job_builds_the_rows_selector_then_smokes(workflow: dict[Any, Any]) -> None:
    build = workflow["jobs"]["build"]
    assert build["needs"] == "plan"
    assert build["if"] == "needs.plan.outputs.rows != '0'"
    step = _step(build, "Build")
    assert step["env"]["BUILD_TASKS"] == "${{ matrix.build }}"
    # Split the selector into words without globbing `build:hopper/*`.
    assert 'read -ra tasks <<< "$BUILD_TASKS"' in step["run"]
    assert 'doit "${tasks[@]}"' in step["run"]
    assert step["if"] == "matrix.toolchain-available"
    names = [s.get("name") for s in _steps(build)]
    assert names.index("Build") < names.index("Smoke")
    assert _step(build, "Smoke")["if"] == "matrix.toolchain-available && matrix.smoke != ''"


def test_smoke_job_runs_after_every_shard(workflow: dict[Any, Any]) -> None:
    smoke = workflow["jobs"]["smoke"]
    assert smoke["needs"] == ["plan", "build"]
    assert "!cancelled()" in smoke["if"] and "needs.plan.outputs.smoke-rows != '0'" in smoke["if"]
    assert "Build" not in [s.get("name") for s in _steps(smoke)]


def test_only_the_smoke_job_requires_hits(workflow: dict[Any, Any]) -> None:
    # The build rows compile (CPU runners); the smoke rows (GPU runners) may only restore
    # what they published: a miss fails instead of compiling there. The variable is the
    # configuration's own, so a rename cannot leave the workflow setting nothing.
    assert ENV_VARS["METRALE_ORCH_REQUIRE_HITS"] == "require_hits"
    assert "METRALE_ORCH_REQUIRE_HITS" not in workflow["jobs"]["build"]["env"]
    value = workflow["jobs"]["smoke"]["env"]["METRALE_ORCH_REQUIRE_HITS"]
    # A fork's build rows cannot publish (read-only cache): its smoke job compiles.
    assert value == "${{ github.event.pull_request.head.repo.fork && 'false' || 'true' }}"
    assert "require_hits" in _step(workflow["jobs"]["smoke"], "Summary")["run"]


def test_every_matrix_key_the_workflow_reads_is_a_row_key() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    used = set(re.findall(r"\bmatrix\.([A-Za-z0-9_-]+)", text))
    assert used, "the workflow reads no matrix key"
    assert used <= ROW_KEYS, f"not written by metrale-orch matrix: {sorted(used - ROW_KEYS)}"


def test_actions_are_pinned_to_a_major_version(workflow: dict[Any, Any]) -> None:
    uses = [s["uses"] for job in workflow["jobs"].values() for s in _steps(job) if "uses" in s]
    assert uses, "the workflow uses actions (at least actions/checkout)"
    for action in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w.-]+)?@v\d+", action), action
