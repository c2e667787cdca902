"""dsh's migration of an older session log to the current format (v4), as
dsh 0.2.1 does it: the v0 chain (:mod:`.chain`: :mod:`.v0_to_v1`,
:mod:`.v1_to_v2`, :mod:`.v2_to_v3`, then v3's reading, whose v3→v4 edge is
:mod:`dsh_core.formats.v3.to_v4`), dsh's checks of released v0 logs
(:mod:`.v0_checks`), and ``migrate``, which writes the v4 file beside its
source (:mod:`.migrate`). docs/formats/migration.md.
"""

from .chain import MigratedLog, migrate_v0_log
from .migrate import V4_NAME, children_of, migrate, migrated_log, v4_file

__all__ = ["MigratedLog", "V4_NAME", "children_of", "migrate", "migrate_v0_log", "migrated_log", "v4_file"]
