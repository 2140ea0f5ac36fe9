"""The agent loop's pure core: its turns' records and fold, contexts and commits."""
