"""Exceptions raised by the solver. Every message names the object at fault."""


class SolverError(Exception):
    """Base of every solver exception."""


class InvalidInput(SolverError, ValueError):
    """The input cannot be placed as given (bad quantities, unknown nodes, inconsistent groups)."""


class PlacementInvalid(SolverError, AssertionError):
    """A placement breaks a rule: raised by :func:`solver.validate.assert_placement_valid`."""
