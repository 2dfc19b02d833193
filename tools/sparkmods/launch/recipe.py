"""A run-recipe.sh v1 recipe, loaded and schema-checked.

The format is eugr's (spark-vllm-docker `run-recipe.sh`, also run by sparkrun), so our recipes
stay runnable by those tools as they are: required `name`, `recipe_version: "1"`, `container`,
`command`; optional `description`, `model`, `mods`, `defaults`, `env`, `build_args`,
`cluster_only`, `solo_only`. `command` is filled with `str.format` over `defaults` plus the
runner's overrides, which is why every placeholder must have a default and literal braces are
written `{{ }}`.

A recipe is input: the file is read without blocking (a FIFO is refused), at most
MAX_RECIPE_BYTES, and the loaded document may expand to at most MAX_EXPANDED units (one per
value, plus the length of every string) with its YAML aliases followed, so an alias bomb
(a few lines that expand to billions of values) is one line, not minutes and gigabytes.
Values are never formatted into a message whole: `brief()` bounds them.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import yaml

from sparkmods.errors import SparkmodsError
from sparkmods.inputfile import read_text_file
from sparkmods.runtime.manifest import MANIFEST_TOML

__all__ = ["Recipe", "RecipeError", "load_recipe", "find_repo_root", "placeholders", "format_value", "Scalar"]

Scalar = Union[str, int, float, bool]

REQUIRED = ("name", "recipe_version", "container", "command")
OPTIONAL = ("description", "model", "mods", "defaults", "env", "build_args", "cluster_only", "solo_only")
RECIPE_VERSION = "1"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_RECIPE_BYTES = 1024 * 1024  # real recipes are a few KB
MAX_EXPANDED = 1024 * 1024  # values plus string lengths, aliases followed; real recipes: a few thousand
_BRIEF = 60
# What a value may not hold: defaults are formatted into the command, env values only refused
# where nothing could carry them (line breaks in env are a launch rule: the cluster form's).
_BAD_IN = {"defaults": re.compile(r"[\x00-\x08\x0a-\x1f\x7f]"), "env": re.compile(r"\x00")}
_CONTROL_NAMES = {"\x00": "a NUL byte", "\n": "a line break", "\r": "a carriage return"}


class RecipeError(SparkmodsError):
    """A recipe problem: `<file>: <key>: <problem>` (exit 2)."""


class _TwiceGiven(Exception):
    """A mapping key the YAML gives twice: (key, first line, second line)."""


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML requires keys
    to be unique; PyYAML silently keeps the last, so a second `command:` would win unseen)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _TwiceGiven(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep)


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    container: str
    command: str
    description: str = ""
    model: Optional[str] = None
    mods: Tuple[str, ...] = ()
    defaults: Tuple[Tuple[str, Scalar], ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()
    build_args: Tuple[str, ...] = ()
    cluster_only: bool = False
    solo_only: bool = False

    @property
    def defaults_map(self) -> Dict[str, Scalar]:
        return dict(self.defaults)

    @property
    def env_map(self) -> Dict[str, str]:
        return dict(self.env)

    def mod_dirs(self, root: Path, mods: Optional[Path] = None) -> List[Path]:
        """The mods' folders, absolute (launch-cluster.sh wants them so); unknown mods fail.

        `mods/<name>` entries resolve in `mods` when given (--mods-dir, or the collection's
        folder for a recipe kept outside any repository), else under root like every other entry.
        A mod is known when its folder holds run.sh (what --apply-mod needs) or our mod.toml.
        """
        out = []
        for i, rel in enumerate(self.mods):
            parts = PurePosixPath(rel).parts
            base, tail = (mods, parts[1:]) if mods is not None and len(parts) > 1 and parts[0] == "mods" else (root, parts)
            folder = base.joinpath(*tail).resolve()
            if not ((folder / "run.sh").is_file() or (folder / MANIFEST_TOML).is_file()):
                where = f"in {mods}" if base is mods else f"under {root}"
                raise RecipeError(f"{self.path}: mods[{i}]: {brief(rel)} is not a mod folder {where} "
                                  f"(no run.sh or {MANIFEST_TOML} in {folder}); say where the mods are "
                                  f"with --mods-dir DIR")
            out.append(folder)
        return out


def brief(value: Any) -> str:
    """A recipe value for a message, never longer than about _BRIEF characters."""
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= _BRIEF else text[:_BRIEF - 3] + "..."


def _key_text(key: Any) -> str:
    """A mapping key for a message: a string as it is (bounded), anything else as brief() says."""
    return (key if len(key) <= _BRIEF else key[:_BRIEF - 3] + "...") if isinstance(key, str) else brief(key)


def _expands_past(data: Any, budget: int) -> bool:
    """True when data, every alias followed (shared and cyclic values counted each time they
    occur), holds more than budget units: one per value plus the length of each string."""
    stack = [data]
    while stack:
        item = stack.pop()
        budget -= 1 + (len(item) if isinstance(item, str) else 0)
        if budget < 0:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def placeholders(command: str) -> List[str]:
    """The `{name}` fields of a str.format template, in order, without repeats."""
    seen: List[str] = []
    for _, field, _, _ in string.Formatter().parse(command):
        if field is not None and field not in seen:
            seen.append(field)
    return seen


def format_value(value: Scalar) -> str:
    """A default or --set value as text: YAML true/false become vLLM's lowercase true/false."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def find_repo_root(recipe_path: Path) -> Path:
    """The recipe repository root: the nearest folder above the recipe that holds `mods/`.

    eugr's layout keeps recipes in `recipes/` beside `mods/`; ours keeps them in
    `launch/recipes/`. Both resolve `mods/<name>` against the first ancestor with a mods folder.
    """
    for parent in recipe_path.resolve().parents:
        if (parent / "mods").is_dir():
            return parent
    return recipe_path.resolve().parent


class _Checker:
    """Strict schema check; every failure names the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> RecipeError:
        return RecipeError(f"{self.path}: {key}: {problem}")

    def text(self, data: Mapping[str, Any], key: str) -> str:
        value = data[key]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {brief(value)}")
        return value

    def flag(self, data: Mapping[str, Any], key: str) -> bool:
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {brief(value)}")
        return value

    def str_list(self, data: Mapping[str, Any], key: str) -> Tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.fail(key, f"must be a list of non-empty strings, got {brief(value)}")
        return tuple(value)

    def scalar_map(self, data: Mapping[str, Any], key: str) -> Dict[str, Any]:
        value = data.get(key) or {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__}")
        for k, v in value.items():
            if not isinstance(k, str) or not _KEY.match(k):
                raise self.fail(f"{key}.{_key_text(k)}", "keys must be identifiers (letters, digits, _)")
            if not isinstance(v, (str, int, float, bool)):
                raise self.fail(f"{key}.{k}", f"must be a string, number or boolean, got {type(v).__name__}")
            bad = _BAD_IN[key].search(v) if isinstance(v, str) else None
            if bad:
                raise self.fail(f"{key}.{k}", f"holds {_CONTROL_NAMES.get(bad.group(), 'a control character')}; "
                                              "a value is one line of text")
        return value

    def recipe(self, data: Any) -> Recipe:
        if not isinstance(data, dict):
            raise self.fail("(top)", "a recipe is a YAML mapping")
        for key in REQUIRED:
            if key not in data:
                raise self.fail(key, "missing (required)")
        for key in data:
            if key not in REQUIRED and key not in OPTIONAL:
                raise self.fail(_key_text(key), f"unknown key (allowed: {', '.join(REQUIRED + OPTIONAL)})")
        if data["recipe_version"] != RECIPE_VERSION:
            raise self.fail("recipe_version", f"must be the string \"{RECIPE_VERSION}\", "
                                              f"got {brief(data['recipe_version'])}")
        defaults = self.scalar_map(data, "defaults")
        env = self.scalar_map(data, "env")
        for name in env:
            if not _ENV_NAME.match(name):
                raise self.fail(f"env.{name}", "not a valid environment variable name")
        mods = self.str_list(data, "mods")
        for i, rel in enumerate(mods):
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise self.fail(f"mods[{i}]", f"{brief(rel)} must be relative to the recipe repository root, "
                                              f"inside it")
        if len(set(mods)) != len(mods):
            raise self.fail("mods", "lists a mod twice")
        cluster_only, solo_only = self.flag(data, "cluster_only"), self.flag(data, "solo_only")
        if cluster_only and solo_only:
            raise self.fail("cluster_only", "cluster_only and solo_only cannot both be true")
        model = self.text(data, "model") if "model" in data else None
        description = self.text(data, "description") if "description" in data else ""
        command = self.text(data, "command")
        recipe = Recipe(
            path=self.path, name=self.text(data, "name"), container=self.text(data, "container"),
            command=command, description=description, model=model, mods=mods,
            defaults=tuple(defaults.items()), env=tuple((k, format_value(v)) for k, v in env.items()),
            build_args=self.str_list(data, "build_args"), cluster_only=cluster_only, solo_only=solo_only,
        )
        self.check_placeholders(recipe)
        return recipe

    def check_placeholders(self, recipe: Recipe) -> None:
        try:
            fields = list(string.Formatter().parse(recipe.command))
        except ValueError as exc:
            raise self.fail("command", f"not a valid format template ({exc}): write literal braces as {{{{ and }}}}") from None
        for _, field, spec, conversion in fields:
            if field is None:
                continue
            if not _KEY.match(field):
                raise self.fail("command", f"placeholder {{{field}}} is not a plain name: "
                                           "write literal braces as {{ and }}")
            if spec or conversion:  # `{port:1500000000}` pads the value to 1.5 GB
                shown = field + (f"!{conversion}" if conversion else "") + (f":{brief(spec)[1:-1]}" if spec else "")
                raise self.fail("command", f"placeholder {{{shown}}} has a conversion or format spec; write "
                                           f"{{{field}}} (the value is used as it is)")
            if field not in recipe.defaults_map:
                raise self.fail("command", f"placeholder {{{field}}} has no value in defaults")


def load_recipe(path: Union[str, Path]) -> Recipe:
    """Read and schema-check one recipe file; problems raise RecipeError (one line)."""
    p = Path(path)
    try:
        text = read_text_file(p, MAX_RECIPE_BYTES, "want a run-recipe.sh v1 YAML recipe")
    except SparkmodsError as exc:
        raise RecipeError(str(exc)) from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader
    except _TwiceGiven as exc:
        key, first, second = exc.args
        raise RecipeError(f"{p}: {_key_text(key)}: given twice (lines {first} and {second}); "
                          "keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{p}: (syntax): not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise RecipeError(f"{p}: (syntax): the YAML nests too deeply") from None
    if _expands_past(data, MAX_EXPANDED):
        raise RecipeError(f"{p}: (size): the YAML expands to more than {MAX_EXPANDED} values and characters "
                          f"with its aliases followed (an alias bomb?); write the values out")
    return _Checker(p).recipe(data)
