"""The Great Expectations suites (``expectations/``) run against the bronze and silver tables
before the next layer is built from them."""
