"""The two arms and their loop: vanilla greedy, speculative verify, drafters, comparison and replay (the Session
that runs them, ``core/session.py``, stands above this room and ``diagnose/``)."""
