"""Tiny random-weight drafters for llama.cpp's model-based speculative types, written with the gguf package.

One writer per ``--spec-type`` whose drafter is an architecture of its own:
EAGLE-3 (``eagle3``) and DFlash / DSpark (``dflash``; DSpark adds a Markov
head).  Each is shaped by the target it pairs with (its hidden size, layer
count and vocabulary) and is small enough to load in well under a second.
Their weights are random: they exercise a speculative path, every verify pass
1 + n_drafted tokens wide, and propose tokens the target nearly always rejects.
"""
