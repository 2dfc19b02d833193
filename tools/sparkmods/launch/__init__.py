"""Recipes (run-recipe.sh v1 YAML) and launch-script generation for `sparkmods launch`.

recipe.py    the recipe model and its schema check
servecmd.py  the `vllm serve` command of a recipe: parse, query, re-render on one line
plan.py      recipe + command-line choices -> one LaunchPlan (nodes, mods, env, serve argv)
vllmfacts.py  facts read from the vLLM's own source (speculative methods, cache dtypes)
vllmopen.py  which vLLM to check against (the image, else --vllm), and the mod check
pervllm.py   one plan validated on every vLLM named (TargetProblem: a problem and its vLLM)
problem.py   Problem and the Context a rule sees
modrules.py  rules about the mods; flagrules.py: rules about flags, layout and shell safety
rules.py     validate(): runs every rule
render.py    picks the form, writes the script atomically
shell.py     bash quoting helpers shared by the two script forms
cluster.py   the script that drives launch-cluster.sh (its options read from its --help at run time)
standalone.py  the script that needs only docker and ssh
nodewords.py  the words each node runs to join the others (Ray head/worker, no-Ray ranks)
sparkrun.py  the recipes in sparkrun's format (launch/sparkrun/, generated from launch/recipes/)
"""
