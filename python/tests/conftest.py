import os
import sys

# The tests import the installed package (`pip install ./python`), not the source tree.
here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(here)]
