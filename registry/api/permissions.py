from rest_framework.permissions import SAFE_METHODS, BasePermission

from registry.roles import has_role


class RolePermission(BasePermission):
    """The API's default permission: reads need the view's `read_role` (default viewer), writes
    its `write_role` (default engineer); a view raises either by setting the attribute."""

    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", "viewer")
        else:
            needed = getattr(view, "write_role", "engineer")
        if not has_role(request.user, needed):
            self.message = f"this needs the {needed} role"
            return False
        return True

