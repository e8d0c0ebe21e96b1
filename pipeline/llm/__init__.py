"""Language-model backends behind one interface (`pipeline.llm.base.LLM`)."""
