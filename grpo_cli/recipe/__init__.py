"""Recipes: YAML files of TRL and grpo keys, loaded, type-checked and checked as a whole before anything heavy runs."""

from grpo_cli.recipe.check import Plan, check_recipe, reward_funcs, reward_names
from grpo_cli.recipe.load import Recipe, builtin_recipes, find_recipe, load_recipe

__all__ = ["Plan", "Recipe", "builtin_recipes", "check_recipe", "find_recipe", "load_recipe", "reward_funcs", "reward_names"]
