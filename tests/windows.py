"""Fixed windows for tests that count: long enough that no test straddles a boundary.

A fixed window is aligned to its clock (Redis's ``TIME`` or the monotonic clock),
so a 60 s window rolls over at every minute: a test asserting "the third call is
refused" fails about once in a few hundred runs if a boundary falls between its calls.
Thirty days apart, boundaries practically never fall inside a test (and limits up to
~3,400 stay within what a policy computes exactly over such a window).
"""

#: A window length no test run straddles a boundary of (in practice), in seconds.
NO_ROLLOVER = 30 * 24 * 3600.0
