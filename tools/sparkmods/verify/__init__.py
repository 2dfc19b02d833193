"""`sparkmods verify`: did each mod take effect on a running vLLM OpenAI server?

A mod that applies can still do nothing: the checkpoint lacks what it acts on, a flag is
missing, the container was reused from before the mod. This package gathers what a running
server shows about itself and judges each mod from it:

  client.py     HTTP to the server (stdlib), with an optional recorder of every exchange
  metrics.py    the Prometheus text of GET /metrics: KV cache config, speculative decoding counters
  serverlog.py  the server log: vLLM's start-up lines, our mods' own lines, run.sh's `[mod]` lines
  template.py   the chat-template mod's template rendered on the host, as transformers renders it
  facts.py      one `Evidence` from all sources (sends probe traffic when the counters are too few)
  judges.py     one judge per mod: `in effect`, `not in effect`, `not requested` or `unknown`
  report.py     the table or JSON document, and the exit code
  capture.py    record a live server's answers into a test scenario folder
"""
