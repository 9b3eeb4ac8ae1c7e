"""Rights a migration's new table takes over from an existing one."""

from __future__ import annotations


def copy_grants(source: str, target: str) -> str:
    """A statement granting on `target` every right any role but the owner holds on
    `source` (both plain table names), so whoever could write or delete rows of
    `source` can still do so when a statement or trigger also touches `target`."""
    return f"""
        DO $$
        DECLARE g record;
        BEGIN
            FOR g IN
                SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                           AS grantee,
                       a.privilege_type
                  FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                 WHERE c.oid = '{source}'::regclass AND a.grantee <> c.relowner
            LOOP
                EXECUTE format('GRANT %s ON {target} TO %s', g.privilege_type, g.grantee);
            END LOOP;
        END
        $$
        """
