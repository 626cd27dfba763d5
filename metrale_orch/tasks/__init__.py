"""The doit integration: task specs and dicts, actions, the content checker, the reporter,
the task cache and the run lock.  Nothing below this package knows doit.
"""
