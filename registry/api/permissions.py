from rest_framework.permissions import SAFE_METHODS, BasePermission

from registry.roles import has_role

READ_ONLY_REFUSAL = ("this API token has the read-only scope: it may only read (GET, HEAD, "
                     "OPTIONS); create a token without read-only to make changes")


class RolePermission(BasePermission):
    """The API's default permission: reads need the view's `read_role` (default viewer), writes
    its `write_role` (default engineer); a view raises either by setting the attribute. A
    read-only token never writes, whatever its user's role."""

    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", "viewer")
        else:
            if getattr(request.auth, "read_only", False):
                self.message = READ_ONLY_REFUSAL
                return False
            needed = getattr(view, "write_role", "engineer")
        if not has_role(request.user, needed):
            self.message = f"this needs the {needed} role"
            return False
        return True
