"""The models a run can take, in the app: the pickers and their choices, the Models menu, and the scan that finds the
user's own models off the GUI thread.

* :mod:`.choices` -- demo names, the quantizations of one model a user has, and writing a missing one.
* :mod:`.catalog` -- what the pickers offer from the last scan: grouped targets, the drafters that fit a target.
* :mod:`.picker` -- one model picker (a demo name, a found model or a path, and its other quantizations).
* :mod:`.offers` -- the pickers' lists kept in step with the run.
* :mod:`.scan`, :mod:`.menu` -- the scanner thread, and the Models menu with the scan's place in the window.
"""
