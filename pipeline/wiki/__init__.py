"""The Wikipedia environment (Search / Lookup / Finish) and its page backends."""
