"""agentic-retriever: train dense retrievers for search agents from the agents' own trajectories.

The method is Agentic-R ("Agentic-R: Learning to Retrieve for Agentic Search"); see README.md ("How it works") for the
pipeline.
"""

__version__ = "0.1.0"

from . import _moved

_moved.install()  # the import paths of 0.1 that moved keep working for one release, with a DeprecationWarning
