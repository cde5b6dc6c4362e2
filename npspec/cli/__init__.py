"""The command line: `npspec generate` and `npspec convert` (main), their options and streams (console), a Ctrl-C
while starting (startup), the --compare harness (harness) and the HTML picture of a trace (picture).

The top of the house: it may import every other wing; nothing below imports it (npspec/__init__.py takes only
startup's Ctrl-C guard, which must run before the slow imports).
"""
