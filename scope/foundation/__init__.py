"""scope/foundation/: what every package stands on, kept apart from placement.

The error root (:mod:`scope.foundation.errors`), the declarative config schema with its parsers
(:mod:`scope.foundation.schema`), the injectable clock (:mod:`scope.foundation.clock`) and the
``/proc`` process-identity readers (:mod:`scope.foundation.procstat`). They live under scope/
because it is the lowest package, so registry/ and dispatcher/ may import them without an upward
import; nothing here knows about placement, sessions, cards or cron.
"""
