"""What tests share and that is not itself a test: fakes of the roles, and helpers
that run graph files end to end. Test modules import from here, never from each
other (tests/test_suite_layout.py checks that)."""
