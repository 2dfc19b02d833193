"""Community mods (eugr/spark-vllm-docker style: a run.sh and diff files, no mod.toml).

They are judged without running them: shell.py reads run.sh into a small syntax tree,
runsh.py walks it (variables, `cd`, `|| echo`, `if patch --dry-run`, `set -e`) into the patch
steps run.sh would take and the lines that change files by other means, judge.py checks the
steps with the patch engine the way run.sh behaves, and adopt.py turns a mod into one of ours.
"""
