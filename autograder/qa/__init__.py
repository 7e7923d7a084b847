"""The course's own quality checks, for instructors (never shipped to students): ``verify``, ``regress``, ``bench``.

* ``verify``: every lab's tests proved sound before students see them (solution full marks, stub zero, every hidden
  test failing on the stub, every design threshold failing on the course's baseline);
* ``design``: the design parts' references, data generators and baselines that ``verify`` swaps in;
* ``regress``: every lecture and lab source notebook run top to bottom with papermill, FAST=True;
* ``bench``: the autograder measured against its time targets.
"""
