from sparkmods.cli import entry

entry()
