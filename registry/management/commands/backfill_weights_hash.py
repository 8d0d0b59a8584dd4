from django.core.management.base import BaseCommand

from registry.validation import backfill_weights_hashes


class Command(BaseCommand):
    help = ("Give ready versions validated before the weights hash existed their hash (the "
            "worker also does it in the background, MMC_WEIGHTS_BACKFILL_BATCH per run).")

    def add_arguments(self, parser):
        parser.add_argument("--limit", type=int, default=1000)

    def handle(self, *args, limit, **options):
        filled = backfill_weights_hashes(limit=limit)
        self.stdout.write(f"hashed the weights of {len(filled)} version(s)"
                          + (f": {', '.join(filled)}" if filled else ""))
