"""Lab 05's engine tests fork: a block manager without copy-on-write loses engine-visible's points.

A request with n = 4 completions whose 9-token prompt ends part-way through a block of 4 rides along the pressured
golden requests; its completions share that last block and part at its third position. A planted BlockManager whose
append_slot never copies (each completion writes into the shared block) passes the n = 1 requests alone, and fails
once the fork rides along, naming the completion and the first differing token.
"""
import functools

import pytest

import autograder.labs as labs
from autograder_support import notebook_cell
from miniengine.paths import REPO_ROOT

LAB05 = REPO_ROOT / "labs" / "lab05_paged_attention" / "lab05_paged_attention.ipynb"
NO_COW = "        return None  # planted: the writer keeps writing into the shared block"


cell = functools.partial(notebook_cell, LAB05)  # a cell's source by its grade_id


def notebook_parts(block_manager_source: str) -> dict:
    ns: dict = {"__name__": "__main__"}  # the harness insists the parts are the notebook's own
    exec("import torch\nfrom collections import deque\n" + block_manager_source + "\n" + cell("gather_history"), ns)
    return ns


@pytest.fixture(scope="module")
def lab():
    return labs.pristine("lab05")


def planted_without_copy_on_write() -> str:
    source = cell("BlockManager")
    shared = """        if self.ref_count[src] == 1:  # seq's own block, with room left
            return None"""
    assert shared in source
    return source.replace(shared, NO_COW)


@pytest.mark.slow
def test_the_fork_case_catches_a_block_manager_without_copy_on_write(lab):
    cases = lab.golden_cases(lab.VISIBLE_GOLDEN, 2)
    fork = lab.golden_fork_case(lab.VISIBLE_GOLDEN, "p0-n4")
    assert len(fork["prompt_token_ids"]) % 4 != 0  # the prompt's last block of 4 is part full: the forks share it
    solution, planted = notebook_parts(cell("BlockManager")), notebook_parts(planted_without_copy_on_write())
    for parts in (solution, planted):  # without the fork, nothing tells them apart
        lab.check_pressure(parts["BlockManager"], parts["gather_history"], cases, block_size=4, max_num_seqs=8,
                           label="")
    lab.check_pressure(solution["BlockManager"], solution["gather_history"], cases, block_size=4, max_num_seqs=8,
                       label="", forks=[fork])
    with pytest.raises(AssertionError, match=r"p0-n4, completion \d .*first difference at step \d+"):
        lab.check_pressure(planted["BlockManager"], planted["gather_history"], cases, block_size=4, max_num_seqs=8,
                           label="", forks=[fork])
