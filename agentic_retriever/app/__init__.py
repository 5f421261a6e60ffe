"""The application: the one layer that uses both the retriever's side (`agentic_retriever`) and the agent (`agent`).

The command line (`cli`, its command table `commands`, the config files and flags it reads `config_loader`), the
main job on the embedded default stack (`demo`) and the co-training loop (`loop`, the paper's Algorithm 1). Nothing
below imports it (docs/architecture.md, "Layers").
"""
