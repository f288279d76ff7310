"""A size sweep: the experiment file's members (`experiment`), the plan that sizes them
(`planner`) and the in-process runner that trains, probes and reports them (`runner`)."""
