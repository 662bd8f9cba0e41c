"""tdtree's entry points for pytest and hypothesis, outside the ``tdtree`` package.

Every module installed with pytest's ``pytest11`` entry points, and every
``hypothesis`` entry-point hook, is imported in each pytest run or hypothesis
import of the environment, whether the code under test uses tdtree or not. A module
inside ``tdtree`` would import ``tdtree`` (and torch) first, so these live here and
import neither: the fixtures reach tdtree only through the nodes a test hands them,
and the hypothesis hook registers tdtree's strategies only when tdtree is imported.
"""
