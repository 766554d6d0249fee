"""Data-plane client keys (hashed), with their endpoint scope and rate.

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('client_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('endpoints', sa.JSON(), nullable=True),
    sa.Column('rate', sa.Float(), nullable=True),
    sa.Column('burst', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', name='uq_client_key_name'),
    sa.UniqueConstraint('key_hash', name='uq_client_key_hash')
    )


def downgrade() -> None:
    op.drop_table('client_keys')
