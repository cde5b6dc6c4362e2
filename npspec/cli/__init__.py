"""The command line: `npspec generate` and `npspec convert` (main, generate, convert), generate's options, inputs,
drafts, kernel choice and report, the commands' streams (console), Ctrl-C while starting (startup), the --compare
harness (harness) and the HTML picture of a trace (picture). The top wing: it may import every other; nothing
below imports it (npspec/__init__.py takes only startup's Ctrl-C guard, which must run before the slow imports).
"""
