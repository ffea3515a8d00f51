"""`brokerlens land`: the landing files of a day → bronze tables (:mod:`.bronze`), one parser
module per landing kind. The package itself imports nothing, so that the ``land`` settings
section (:mod:`.settings`) can be read without Spark."""
