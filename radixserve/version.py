"""The package's version, in a module of its own: modules of the package read it here, never
from the package root, which names every public class (importing it would close a circle)."""

__version__ = "0.1.0"
