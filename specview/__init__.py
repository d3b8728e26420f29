"""specview: does greedy speculative decoding give exactly the text plain greedy decoding gives?"""

__version__ = "0.1.0"
