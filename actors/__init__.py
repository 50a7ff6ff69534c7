"""Ray actors and topology: generators, env workers, learner group, buffer, weight sync."""
