"""The demo report's sentence on model selection names what was kept, on which inputs and by which scores."""

from agentic_retriever.demo import selection_note


def test_selection_note_names_the_inputs_that_decided_and_the_scores():
    selection = {"metric": "mrr@10", "compose_with": ["none", "parent"], "kept": "epoch-2",
                 "per_checkpoint": {"base": 0.8414, "epoch-1": 0.8665, "epoch-2": 0.8686}}
    note = selection_note(selection)
    assert "the bare question and composed with its parent question, the mean deciding" in note
    assert "base 0.841, epoch-1 0.867, epoch-2 0.869" in note and note.rstrip().endswith("kept epoch-2.")


def test_selection_note_says_when_the_base_was_kept_and_is_empty_without_a_selection():
    note = selection_note({"metric": "mrr@10", "compose_with": ["self"], "kept": "base",
                           "per_checkpoint": {"base": 0.9, "epoch-1": 0.8}})
    assert "(Q [SEP] Q)" in note and "kept the BASE weights" in note and "the mean deciding" not in note
    assert selection_note(None) == "" and selection_note({"kept": None}) == ""
