"""The two arms and their loop: vanilla greedy, speculative verify, drafters, comparison, and the Session that runs them."""
