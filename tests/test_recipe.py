"""Recipe model and validation: positions, messages, hints, cross-field rules, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from spotrun.cli import main
from spotrun.errors import RecipeError
from spotrun.recipe.schema import Recipe, check_file, check_files, load_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))

GOOD = """\
name: demo
resources:
  - provider: local
    instance_type: cpu-small
nodes:
  min: 1
  max: 2
run: python train.py
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    """Problem lines of `text` with the file name replaced by 'F'."""
    path = write(tmp_path, text)
    check = check_file(path)
    assert check.ok == (not check.problems)
    return [line.replace(str(path), "F", 1) for line in check.problems]


# --- the example recipes ---------------------------------------------------------------------


def test_example_recipes_exist() -> None:
    names = {p.name for p in RECIPES}
    assert {"quickstart.yaml", "aws-a100.yaml", "gcp-a100.yaml", "azure-v100.yaml"} <= names
    assert (REPO / "recipes" / "quickstart" / "train.py").is_file()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_example_recipe_validates_and_round_trips(path: Path) -> None:
    recipe = load_recipe(path)
    again = Recipe.from_json(recipe.to_json())
    assert again == recipe
    assert json.loads(again.to_json()) == recipe.model_dump(mode="json")


def test_quickstart_contents() -> None:
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml")
    assert recipe.name == "quickstart"
    assert recipe.providers == {"local"}
    assert (recipe.nodes.min, recipe.nodes.max, recipe.nodes.target) == (1, 4, 3)
    assert recipe.workdir == (REPO / "recipes" / "quickstart").resolve()
    assert recipe.workdir.is_absolute() and (recipe.workdir / "train.py").is_file()
    assert recipe.checkpoint is not None and recipe.checkpoint.every_steps == 20
    assert (
        recipe.resources[0].prices is not None
        and recipe.resources[0].prices.spot < recipe.resources[0].prices.on_demand
    )
    assert recipe.chaos is not None and recipe.chaos.preempt
    assert recipe.env["OMP_NUM_THREADS"] == "1"


def test_aws_accelerator_forms_normalise() -> None:
    recipe = load_recipe(REPO / "recipes" / "aws-a100.yaml")
    accels = [r.accelerators for r in recipe.resources]
    assert [(a.name, a.count) for a in accels if a] == [("A100", 8), ("A100", 8), ("A10G", 4)]
    assert str(accels[0]) == "A100:8"
    assert recipe.nodes.target == recipe.nodes.min  # omitted target defaults to min


# --- defaults and normalisation ----------------------------------------------------------------


def test_minimal_recipe_defaults(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.workdir == tmp_path.resolve()
    assert recipe.nodes.target == 1
    assert recipe.resources[0].spot is True
    assert recipe.control_plane.mode == "embedded" and recipe.control_plane.endpoints == ()
    assert recipe.checkpoint is None and recipe.budget is None and recipe.chaos is None
    assert recipe.env == {}


def test_accelerators_and_env_coercion(tmp_path: Path) -> None:
    text = GOOD.replace(
        "    instance_type: cpu-small\n",
        "    instance_type: cpu-small\n    accelerators: T4\n"
        "  - provider: local\n    instance_type: big\n    accelerators: {H100: 2}\n",
    )
    text += "env:\n  A: 1\n  B: true\n  C: 0.5\n  D: text\n"
    recipe = load_recipe(write(tmp_path, text))
    assert [(r.accelerators.name, r.accelerators.count) for r in recipe.resources if r.accelerators] == [
        ("T4", 1),
        ("H100", 2),
    ]
    assert recipe.env == {"A": "1", "B": "true", "C": "0.5", "D": "text"}


def test_recipe_is_frozen(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD))
    with pytest.raises(ValidationError, match="frozen"):
        recipe.name = "other"  # type: ignore[misc]


def test_round_trip_full(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / "certs" / name).write_text("x")
    text = """\
    name: full
    resources:
      - {provider: aws, region: us-east-1, zone: us-east-1a, instance_type: p4d.24xlarge,
         accelerators: "A100:8", max_price: 9.5, spot: false}
    nodes: {min: 1, max: 4, target: 2}
    setup: pip install -e .
    run: python train.py
    env: {X: 1}
    checkpoint: {every_seconds: 60.5, keep: 1, dir: ck}
    budget: {max_total: 10}
    control_plane:
      mode: external
      endpoints: ["10.0.0.1:2379", "https://etcd.example:2379"]
      tls: {ca: certs/ca.pem, cert: certs/c.pem, key: certs/k.pem}
    """
    recipe = load_recipe(write(tmp_path, text))
    assert (
        recipe.control_plane.tls is not None
        and recipe.control_plane.tls.ca == (tmp_path / "certs" / "ca.pem").resolve()
    )
    data = json.loads(recipe.to_json())
    assert data["resources"][0]["accelerators"] == {"name": "A100", "count": 8}
    assert Recipe.from_json(recipe.to_json()) == recipe
    assert Recipe.model_validate(recipe.model_dump(mode="json")) == recipe


# --- one line per problem, with position, field, message and hint --------------------------------


def test_unknown_key_with_suggestion(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "nodez: 3\n") == ["F:9:1: nodez: unknown key 'nodez' (did you mean 'nodes'?)"]


def test_unknown_key_lists_allowed_keys(tmp_path: Path) -> None:
    text = GOOD.replace("  max: 2\n", "  max: 2\n  zzz: 1\n")
    assert problems(tmp_path, text) == ["F:8:3: nodes.zzz: unknown key 'zzz' (allowed keys: min, max, target, spares)"]


def test_unknown_key_in_list_item(tmp_path: Path) -> None:
    text = GOOD.replace("    instance_type: cpu-small\n", "    instance_type: cpu-small\n    instance_typo: x\n")
    assert problems(tmp_path, text) == [
        "F:5:5: resources[0].instance_typo: unknown key 'instance_typo' (did you mean 'instance_type'?)"
    ]


def test_missing_field_points_at_parent(tmp_path: Path) -> None:
    text = GOOD.replace("  min: 1\n", "")
    assert problems(tmp_path, text) == ["F:5:1: nodes.min: required field is missing (add 'min:' under nodes)"]


def test_missing_top_level_field(tmp_path: Path) -> None:
    text = "# a comment\n" + GOOD.replace("run: python train.py\n", "")
    assert problems(tmp_path, text) == ["F:2:1: run: required field is missing (add 'run:' at the top level)"]


def test_type_errors_say_what_was_expected(tmp_path: Path) -> None:
    text = GOOD.replace("  min: 1\n", "  min: '1'\n").replace("  max: 2\n", "  max: 2.5\n")
    assert problems(tmp_path, text) == [
        "F:6:8: nodes.min: expected an integer, got '1' (remove the quotes)",
        "F:7:8: nodes.max: expected an integer, got 2.5 (use a whole number)",
    ]


def test_yaml_boolean_where_string_expected(tmp_path: Path) -> None:
    text = GOOD.replace("    instance_type: cpu-small\n", "    instance_type: cpu-small\n    zone: no\n")
    assert problems(tmp_path, text) == [
        "F:5:11: resources[0].zone: expected a string, got false (a boolean) "
        "(YAML reads yes/no/on/off/true/false as booleans; quote the value)"
    ]


def test_mapping_instead_of_list(tmp_path: Path) -> None:
    text = GOOD.replace(
        "  - provider: local\n    instance_type: cpu-small\n", "  provider: local\n  instance_type: cpu-small\n"
    )
    assert problems(tmp_path, text) == [
        "F:2:1: resources: expected a list, got a mapping (start each list item with '- ')"
    ]


def test_scalar_instead_of_mapping(tmp_path: Path) -> None:
    text = GOOD.replace("nodes:\n  min: 1\n  max: 2\n", "nodes: 3\n")
    assert problems(tmp_path, text) == ["F:5:8: nodes: expected a mapping with keys min, max, target, spares, got 3"]


def test_blank_value_points_at_key(tmp_path: Path) -> None:
    text = GOOD.replace("run: python train.py\n", "run:\n")
    assert problems(tmp_path, text) == ["F:8:1: run: expected a string, got an empty value"]


def test_unknown_provider(tmp_path: Path) -> None:
    text = GOOD.replace("provider: local", "provider: awss")
    assert problems(tmp_path, text) == ["F:3:15: resources[0].provider: unknown provider 'awss' (did you mean 'aws'?)"]


def test_bad_names(tmp_path: Path) -> None:
    hint = "lowercase letters, digits and dashes, starting with a letter, at most 40 characters"
    assert problems(tmp_path, GOOD.replace("name: demo", "name: My_Run")) == [
        f"F:1:7: name: name 'My_Run' is not a valid cluster name (try 'my-run'; {hint}, not ending with a dash)"
    ]
    long = "a" * 41
    assert problems(tmp_path, GOOD.replace("name: demo", f"name: {long}")) == [
        f"F:1:7: name: name '{long}' is 41 characters long; at most 40 are allowed ({hint})"
    ]
    assert problems(tmp_path, GOOD.replace("name: demo", "name: 42")) == [
        f"F:1:7: name: expected a string, got 42 ({hint})"
    ]


def test_bad_env_key_points_at_key(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "env:\n  GOOD: 1\n  bad-key: 2\n  LIST: [1]\n") == [
        "F:11:3: env.bad-key: 'bad-key' is not a valid environment variable name "
        "(use letters, digits and underscores, not starting with a digit)",
        "F:12:3: env.LIST: expected a string, number or boolean, got a list",
    ]


def test_bad_accelerators(tmp_path: Path) -> None:
    base = "    instance_type: cpu-small\n"
    hint = "(write it as 'A100:8', 'A100' or {A100: 8})"
    assert problems(tmp_path, GOOD.replace(base, base + "    accelerators: A100:x\n")) == [
        f"F:5:19: resources[0].accelerators: accelerator count in 'A100:x' is not an integer {hint}"
    ]
    assert problems(tmp_path, GOOD.replace(base, base + "    accelerators: A100:0\n")) == [
        f"F:5:19: resources[0].accelerators: accelerator count must be >= 1, got 0 {hint}"
    ]
    assert problems(tmp_path, GOOD.replace(base, base + "    accelerators: {A: 1, B: 2}\n")) == [
        f"F:5:5: resources[0].accelerators: expected one accelerator type, got 2: A, B {hint}"
    ]


def test_workers_per_vm_default_to_accelerators_and_reject_zero(tmp_path: Path) -> None:
    text = GOOD.replace(
        "    instance_type: cpu-small\n",
        "    instance_type: cpu-small\n"
        "  - {provider: local, instance_type: gpu-8, accelerators: 'A100:8'}\n"
        "  - {provider: local, instance_type: gpu-4, accelerators: 'A10G:4', workers: 2}\n",
    )
    recipe = load_recipe(write(tmp_path, text))
    assert [r.workers_per_vm for r in recipe.resources] == [1, 8, 2]
    assert Recipe.from_json(recipe.to_json()).resources[2].workers == 2
    base = "    instance_type: cpu-small\n"
    for bad in ("0", "-1"):
        assert problems(tmp_path, GOOD.replace(base, base + f"    workers: {bad}\n")) == [
            f"F:5:14: resources[0].workers: must be > 0, got {bad}"
        ]


def test_numeric_limits(tmp_path: Path) -> None:
    base = "    instance_type: cpu-small\n"
    text = GOOD.replace(base, base + "    max_price: -1\n") + "checkpoint: {every_steps: 0, keep: 0}\n"
    assert problems(tmp_path, text) == [
        "F:5:16: resources[0].max_price: must be > 0, got -1",
        "F:10:27: checkpoint.every_steps: must be > 0, got 0",
        "F:10:36: checkpoint.keep: must be >= 1, got 0",
    ]


def test_workdir_must_exist(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    hint = f"(workdir is relative to the recipe's directory {str(tmp_path.resolve())!r})"
    missing = (tmp_path / "nothere").resolve()
    assert problems(tmp_path, GOOD + "workdir: nothere\n") == [
        f"F:9:10: workdir: 'nothere' does not exist (resolved to {str(missing)!r}) {hint}"
    ]
    assert problems(tmp_path, GOOD + "workdir: afile\n") == [f"F:9:10: workdir: 'afile' is not a directory {hint}"]
    (tmp_path / "sub").mkdir()
    assert load_recipe(write(tmp_path, GOOD + "workdir: sub\n")).workdir == (tmp_path / "sub").resolve()


def test_all_problems_reported_at_once_in_file_order(tmp_path: Path) -> None:
    text = """\
    name: Bad Name
    resources:
      - provider: gcpp
        instance_type: ""
    nodes:
      min: 0
      max: 2
    run: x
    extra: 1
    """
    lines = problems(tmp_path, text)
    assert [line.split(": ")[0] + ": " + line.split(": ")[1] for line in lines] == [
        "F:1:7: name",
        "F:3:15: resources[0].provider",
        "F:4:20: resources[0].instance_type",
        "F:6:8: nodes.min",
        "F:9:1: extra",
    ]
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text))
    assert len(info.value.problems) == 5
    assert info.value.exit_code == 3
    assert all("\n" not in line for line in info.value.problems)


# --- cross-field rules -----------------------------------------------------------------------------


def test_nodes_min_le_max(tmp_path: Path) -> None:
    text = GOOD.replace("  min: 1\n", "  min: 4\n")
    assert problems(tmp_path, text) == ["F:6:8: nodes.min: nodes.min (4) must be <= nodes.max (2)"]


def test_nodes_target_in_range(tmp_path: Path) -> None:
    text = GOOD.replace("  max: 2\n", "  max: 2\n  target: 5\n")
    assert problems(tmp_path, text) == [
        "F:8:11: nodes.target: nodes.target (5) must be between nodes.min (1) and nodes.max (2) "
        "(omit target to start with nodes.min)"
    ]


def test_checkpoint_needs_an_interval(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "checkpoint:\n  keep: 2\n") == [
        "F:9:1: checkpoint: needs every_steps or every_seconds (or both) (e.g. every_steps: 100)"
    ]


def test_budget_needs_a_cap(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "budget: {}\n") == [
        "F:9:1: budget: needs max_per_hour or max_total (or both) (remove budget for no cap)"
    ]


def test_zone_must_be_in_region(tmp_path: Path) -> None:
    text = GOOD.replace("provider: local", "provider: aws\n    region: us-east-1\n    zone: us-west-2a")
    assert problems(tmp_path, text) == [
        "F:5:11: resources[0].zone: zone 'us-west-2a' is not in region 'us-east-1' "
        "(aws zone names start with their region, e.g. us-east-1a)"
    ]


def test_external_control_plane_needs_endpoints(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "control_plane:\n  mode: external\n") == [
        "F:10:9: control_plane.mode: mode 'external' needs at least one endpoint (add endpoints: [etcd-host:2379])"
    ]
    assert problems(tmp_path, GOOD + "control_plane:\n  endpoints: [a:1]\n") == [
        "F:10:3: control_plane.endpoints: endpoints are only used with mode 'external' "
        "(set mode: external, or remove endpoints)"
    ]
    assert problems(tmp_path, GOOD + "control_plane:\n  mode: externl\n") == [
        "F:10:9: control_plane.mode: unknown control plane mode 'externl' (did you mean 'external'?)"
    ]


def test_endpoint_forms(tmp_path: Path) -> None:
    text = (
        GOOD
        + 'control_plane:\n  mode: external\n  endpoints: [ftp://x:1, "x:99999", nohost, "h:2379", "https://[::1]:2379"]\n'
    )
    hint = "(write host:port or https://host:port, e.g. 10.0.0.5:2379)"
    assert problems(tmp_path, text) == [
        "F:11:15: control_plane.endpoints[0]: endpoint 'ftp://x:1' has scheme 'ftp' "
        "(use https:// or http://, or no scheme)",
        f"F:11:26: control_plane.endpoints[1]: endpoint 'x:99999' has port 99999 outside 1-65535 {hint}",
        f"F:11:37: control_plane.endpoints[2]: endpoint 'nohost' is not host:port or https://host:port {hint}",
    ]


def test_tls_files_must_exist(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    text = GOOD + "control_plane:\n  mode: external\n  endpoints: [h:1]\n  tls: {ca: ca.pem, cert: nope.pem}\n"
    hint = f"(tls.cert is relative to the recipe's directory {str(tmp_path.resolve())!r})"
    assert problems(tmp_path, text) == [
        f"F:12:27: control_plane.tls.cert: 'nope.pem' does not exist "
        f"(resolved to {str((tmp_path / 'nope.pem').resolve())!r}) {hint}"
    ]
    (tmp_path / "c.pem").write_text("x")
    text = GOOD + "control_plane:\n  mode: external\n  endpoints: [h:1]\n  tls: {ca: ca.pem, cert: c.pem}\n"
    assert problems(tmp_path, text) == [
        "F:12:27: control_plane.tls.cert: tls.cert and tls.key go together; tls.key is missing"
    ]


def test_chaos_only_with_local_provider(tmp_path: Path) -> None:
    text = GOOD.replace("  - provider: local\n", "  - provider: local\n    instance_type: a\n  - provider: aws\n", 1)
    text += "chaos:\n  preempt:\n    - {at: 10}\n"
    assert problems(tmp_path, text) == [
        "F:11:1: chaos: chaos is only allowed when every resource uses provider 'local'; "
        "resources[1].provider is 'aws' "
        "(remove chaos, or inject preemptions on clouds with `spotrun preempt`)"
    ]


def test_chaos_events(tmp_path: Path) -> None:
    text = GOOD + "chaos:\n  preempt:\n    - {at: 5, node: 2}\n    - {at: -1, node: fifth}\n"
    assert problems(tmp_path, text) == [
        "F:12:12: chaos.preempt[1].at: must be >= 0, got -1",
        "F:12:22: chaos.preempt[1].node: expected a node index or 'random', got 'fifth' (nodes are numbered from 0)",
    ]
    text = GOOD + "chaos:\n  preempt:\n    - {at: 5, node: 2}\n"
    assert problems(tmp_path, text) == [
        "F:11:21: chaos.preempt[0].node: chaos.preempt[0].node (2) must be < nodes.max (2) (nodes are numbered from 0)"
    ]
    recipe = load_recipe(
        write(tmp_path, GOOD + "chaos:\n  preempt:\n    - {at: 5, node: 1, notice: 0}\n    - {at: 6}\n")
    )
    assert recipe.chaos is not None
    assert [(e.at, e.node, e.notice) for e in recipe.chaos.preempt] == [(5, 1, 0), (6, "random", 30)]


# --- files that are not YAML mappings ---------------------------------------------------------------


def test_yaml_syntax_error(tmp_path: Path) -> None:
    assert problems(tmp_path, "name: x\n  bad: [\n") == ["F:2:6: invalid YAML: mapping values are not allowed here"]


def test_yaml_tab_indentation(tmp_path: Path) -> None:
    assert problems(tmp_path, "name: x\nnodes:\n\tmin: 1\n") == [
        "F:3:1: invalid YAML: found character '\\t' that cannot start any token "
        "(YAML indentation must use spaces, not tabs)"
    ]


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "~\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    assert problems(tmp_path, text) == [
        "F:1:1: file is empty "
        "(a recipe is a mapping with at least name, resources and run; see recipes/quickstart.yaml)"
    ]


def test_not_a_mapping(tmp_path: Path) -> None:
    hint = "(a recipe is a mapping with at least name, resources and run; see recipes/quickstart.yaml)"
    assert problems(tmp_path, "# c\n- a\n- b\n") == [
        f"F:2:1: a recipe must be a mapping of keys to values, got a list {hint}"
    ]
    assert problems(tmp_path, "just text\n") == [
        f"F:1:1: a recipe must be a mapping of keys to values, got the value 'just text' {hint}"
    ]


def test_multiple_documents(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "---\nname: other\n") == [
        "F:9:1: the file holds more than one YAML document "
        "(a recipe file is one document; remove the '---' separator or split the file)"
    ]


def test_duplicate_key(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "name: again\n") == [
        "F:9:1: name: duplicate key 'name' (first defined at line 1, column 1; remove one of them)"
    ]
    text = GOOD.replace("  max: 2\n", "  max: 2\n  min: 1\n")
    assert problems(tmp_path, text) == [
        "F:8:3: nodes.min: duplicate key 'min' (first defined at line 6, column 3; remove one of them)"
    ]


def test_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    text = """\
    name: demo
    resources:
      - &local {provider: local, instance_type: small}
      - <<: *local
        instance_type: big
    nodes: {min: 1, max: 2}
    run: x
    """
    recipe = load_recipe(write(tmp_path, text))
    assert [(r.provider, r.instance_type) for r in recipe.resources] == [("local", "small"), ("local", "big")]


def test_non_string_keys_and_unreadable_values(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "1: one\n") == ["F:9:1: keys must be strings, got '1' (int) (quote the key)"]
    assert problems(tmp_path, GOOD + "setup: !foo bar\n") == [
        "F:9:8: setup: cannot read value 'bar': could not determine a constructor for the tag '!foo' "
        "(quote it to make it a string)"
    ]
    assert problems(tmp_path, GOOD.replace("run: python train.py", "run: 2001-02-30")) == [
        "F:8:6: run: cannot read value '2001-02-30': day is out of range for month (quote it to make it a string)"
    ]


def test_recursive_alias(tmp_path: Path) -> None:
    # The alias is the anchored node itself, so the position is the anchor's.
    assert problems(tmp_path, GOOD + "env: &e {A: *e}\n") == [
        "F:9:6: env.A: an alias refers to itself (recursive structure) (recipes cannot be recursive)"
    ]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    (check,) = check_files([missing])
    assert check.problems == [
        f"{missing}:1:1: file not found (check the path; recipes are YAML files such as recipes/quickstart.yaml)"
    ]
    assert check.recipe is None and not check.ok
    (check,) = check_files([tmp_path])
    assert check.problems == [f"{tmp_path}:1:1: is a directory, not a recipe file (pass the path of a .yaml file)"]


def test_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"name: ok\nrun: caf\xe9\n")
    assert check_file(path).problems == [
        f"{path}:2:9: file is not valid UTF-8 (byte 0xe9) (save the recipe as UTF-8 text)"
    ]


def test_control_character(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("name: ok\nrun: a\x01b\n")
    assert check_file(path).problems == [
        f"{path}:2:7: invalid YAML: unacceptable character #x0001 (remove control characters from the file)"
    ]


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, GOOD)
    if os.geteuid() != 0:  # a real permission error; root reads any file, so fake it there
        path.chmod(0)
    else:

        def deny(self: Path) -> bytes:
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "read_bytes", deny)
    try:
        assert check_file(path).problems == [
            f"{path}:1:1: cannot read file: permission denied (check the file's permissions)"
        ]
    finally:
        path.chmod(0o644)


# --- the CLI ---------------------------------------------------------------------------------------


def test_cli_validate_good(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["validate", *map(str, RECIPES)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    assert f"{REPO / 'recipes' / 'quickstart.yaml'}: ok (recipe quickstart)" in out.splitlines()


def test_cli_validate_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, GOOD, "good.yaml")
    bad = write(tmp_path, GOOD.replace("  min: 1\n", "  min: 4\n") + "nodez: 1\n", "bad.yaml")
    rc = main(["validate", str(good), str(bad), str(tmp_path / "missing.yaml")])
    out, err = capsys.readouterr()
    assert rc == 3
    assert out.splitlines() == [f"{good}: ok (recipe demo)"]
    assert err.splitlines() == [
        f"{bad}:6:8: nodes.min: nodes.min (4) must be <= nodes.max (2)",
        f"{bad}:9:1: nodez: unknown key 'nodez' (did you mean 'nodes'?)",
        f"{tmp_path / 'missing.yaml'}:1:1: file not found "
        "(check the path; recipes are YAML files such as recipes/quickstart.yaml)",
    ]
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "content",
    [b"", b"- a\n", b"a: [\n", b"\xff\xfe", b"a: 1\n---\nb: 2\n", b"a: &x [*x]\n"],
    ids=["empty", "list", "syntax", "binary", "multi", "recursive"],
)
def test_cli_never_shows_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    rc = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert rc == 3
    assert "Traceback" not in out + err
    assert err.splitlines() and all(line.startswith(f"{path}:") for line in err.splitlines())


def test_cli_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "name: x\n", "bad.yaml")
    rc = main(["validate", "--json", str(REPO / "recipes" / "quickstart.yaml"), str(bad)])
    out, _ = capsys.readouterr()
    assert rc == 3
    data = json.loads(out)
    assert [(d["valid"], d["name"]) for d in data] == [(True, "quickstart"), (False, None)]
    assert len(data[1]["problems"]) == 3


def test_validate_imports_stay_light() -> None:
    code = (
        "import spotrun.cli, spotrun.recipe.schema, sys; "
        "bad=[m for m in ('torch','paramiko','libcloud','textual','pyetcd') if m in sys.modules]; assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    code = (
        "import sys; from spotrun.cli import main; rc = main(['validate', sys.argv[1]]); "
        "bad=[m for m in ('torch','paramiko','libcloud','textual','pyetcd') if m in sys.modules]; "
        "assert not bad, bad; sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "recipes" / "quickstart.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_quickstart_train_script_runs_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = REPO / "recipes" / "quickstart" / "train.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = subprocess.run(
        [*command, str(script), "--steps", "20", "--log-every", "10"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["10", "20"]
    assert all(line.split()[2:4] == ["world", "2"] for line in steps)
    assert (tmp_path / "checkpoints" / "step-000000020" / "manifest.json").is_file(), "final checkpoint missing"


def test_head_control_plane_rules(tmp_path: Path) -> None:
    assert problems(tmp_path, GOOD + "control_plane:\n  mode: head\n") == [
        "F:10:9: control_plane.mode: mode 'head' needs a head VM (add head: {instance_type: t3.small})"
    ]
    assert problems(tmp_path, GOOD + "control_plane:\n  head: {instance_type: t3.small}\n") == [
        "F:10:3: control_plane.head: head is only used with mode 'head' (set mode: head, or remove head)"
    ]
    # On the local provider the head would be this machine: refused, with the way out.
    assert problems(tmp_path, GOOD + "control_plane:\n  mode: head\n  head: {instance_type: t3.small}\n") == [
        "F:11:3: control_plane.head: the head VM must be on a cloud provider "
        "(local clusters keep etcd on this machine: use mode embedded)"
    ]
    cloud = GOOD.replace("provider: local", "provider: aws")
    recipe_text = cloud + "control_plane:\n  mode: head\n  head: {instance_type: t3.small, provider: aws}\n"
    assert problems(tmp_path, recipe_text) == []


def test_boot_s_is_for_the_local_provider_only(tmp_path: Path) -> None:
    local = GOOD.replace("instance_type: cpu-small", "instance_type: cpu-small\n    boot_s: 8")
    assert "boot_s" in local and problems(tmp_path, local) == []
    cloud = local.replace("provider: local", "provider: aws") + "control_plane: {mode: external, endpoints: [h:1]}\n"
    assert [p.split(": ", 1)[1] for p in problems(tmp_path, cloud)] == [
        "resources[0].boot_s: boot_s is only for provider 'local' (it emulates a cloud VM's boot time) "
        "(remove boot_s: real clouds take the time they take)"
    ]
