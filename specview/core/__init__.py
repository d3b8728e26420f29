"""specview's Qt-free core: engines, the two arms, drafters, traces, comparison."""
