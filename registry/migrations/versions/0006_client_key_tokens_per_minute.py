"""Client keys: a budget of LLM tokens per minute (prompt plus completion); null means no limit.

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('client_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tokens_per_minute', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('client_keys', schema=None) as batch_op:
        batch_op.drop_column('tokens_per_minute')
