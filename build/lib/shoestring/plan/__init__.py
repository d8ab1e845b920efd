"""The budget planner: hardware peaks, scaling laws (published and fitted on your own sweep),
memory and parallel layout, and the plan that `train --plan` consumes (docs/planning.md)."""
