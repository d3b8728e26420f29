"""Engines over real inference libraries.  Each imports its library lazily."""
